// _linalg_det / _linalg_slogdet on tpu (torch.linalg.det, slogdet, logdet),
// composed of native ops the way ATen's CPU kernel computes them: the LU of
// A^T when A is contiguous (det(A^T) = det(A)), else of A. PyTorch's
// backward formulas rely on exactly that choice (they solve with the saved
// LU and `adjoint = !A.is_contiguous()`), so the returned LU and pivots must
// be those CPU returns. linalg_lu_factor_ex is a native rule
// (lowering/linalg_lu.cpp), complex inputs included.
#include <torch/library.h>

#include "aten/tpu.h"

namespace torch_tpu::aten {
namespace {

void CheckSquareFloat(const at::Tensor& A, const char* op) {
  TORCH_CHECK(A.dim() >= 2, op, ": The input tensor A must have at least 2 dimensions.");
  TORCH_CHECK(A.size(-1) == A.size(-2), op,
              ": A must be batches of square matrices, but they are ", A.size(-2), " by ",
              A.size(-1), " matrices");
  TORCH_CHECK(at::isFloatingType(A.scalar_type()) || at::isComplexType(A.scalar_type()), op,
              ": Expected a floating point or complex tensor as input. Got ", A.scalar_type());
}

// +1 / -1: the parity of getrf's row swaps (pivots are 1-based).
at::Tensor PivotSign(const at::Tensor& pivots, at::ScalarType dtype) {
  auto positions = at::arange(1, pivots.size(-1) + 1, pivots.options());
  auto odd = at::remainder(pivots.ne(positions).sum(-1), 2);
  return (1 - 2 * odd).to(dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> LuOfDetInput(const at::Tensor& A) {
  const bool use_A_T = A.is_contiguous() && !A.is_complex();
  return at::linalg_lu_factor_ex(use_A_T ? A.mT() : A, /*pivot=*/true, /*check_errors=*/false);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> LinalgDet(const at::Tensor& A) {
  CheckSquareFloat(A, "linalg.det");
  auto [LU, pivots, info] = LuOfDetInput(A);
  auto det = LU.diagonal(0, -2, -1).prod(-1) * PivotSign(pivots, A.scalar_type());
  return {det, LU, pivots};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> LinalgSlogdet(const at::Tensor& A) {
  CheckSquareFloat(A, "linalg.slogdet");
  auto [LU, pivots, info] = LuOfDetInput(A);
  auto diag = LU.diagonal(0, -2, -1);
  // sgn: z / |z| for complex (ATen's slogdet), the sign for real values.
  auto sign = diag.sgn().prod(-1) * PivotSign(pivots, A.scalar_type());
  auto logabsdet = diag.abs().log().sum(-1);
  return {sign, logabsdet, LU, pivots};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_linalg_det", LinalgDet);
  m.impl("_linalg_slogdet", LinalgSlogdet);
}

}  // namespace torch_tpu::aten
