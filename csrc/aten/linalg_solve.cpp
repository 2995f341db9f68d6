// _linalg_solve_ex on tpu (torch.linalg.solve, solve_ex), composed of two
// ops with lowering rules (lowering/linalg_lu.cpp): linalg_lu_factor_ex
// of A, then linalg_lu_solve. The returned LU and pivots are those of A,
// as PyTorch's CPU kernel returns them (its autograd formula solves with
// them).
#include <torch/library.h>

#include "aten/tpu.h"

namespace torch_tpu::aten {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> LinalgSolveEx(const at::Tensor& A,
                                                                         const at::Tensor& B,
                                                                         bool left,
                                                                         bool check_errors) {
  TORCH_CHECK(A.dim() >= 2, "linalg.solve: The input tensor A must have at least 2 dimensions.");
  auto [LU, pivots, info] = at::linalg_lu_factor_ex(A, /*pivot=*/true, /*check_errors=*/false);
  if (check_errors) at::_linalg_check_errors(info, "torch.linalg.solve_ex", A.dim() == 2);
  // numpy-compat: B of shape A.shape[:-1] (or 1-D) is a batch of vectors.
  auto rhs_shape = A.sizes().slice(0, A.dim() - 1);
  const bool vector_case = B.dim() == 1 || (A.dim() - 1 == B.dim() && B.sizes() == rhs_shape);
  at::Tensor result =
      at::linalg_lu_solve(LU, pivots, vector_case ? B.unsqueeze(-1) : B, left, /*adjoint=*/false);
  if (vector_case) result = result.squeeze(-1);
  return {result, LU, pivots, info};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("_linalg_solve_ex", LinalgSolveEx); }

}  // namespace torch_tpu::aten
