// Meta kernels (output shapes) for ops PyTorch ships without one, which tpu
// runs natively: the generic tpu kernel (and torch.compile's fake tensors)
// size outputs through them.
// - the fused GRU cell and its backward (CUDA-only ops; PyTorch has meta
//   kernels for the LSTM cell ops but not these). Shapes follow CUDA's
//   kernels (aten/src/ATen/native/cuda/RNN.cu): the workspace is
//   [batch, 5 * hidden].
// - geqrf: (a, tau) of shapes [..., m, n] and [..., min(m, n)].
// - linalg_lstsq (see LstsqMeta), _logcumsumexp.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace torch_tpu::aten {
namespace {

void CheckGates(const at::Tensor& gates, const at::Tensor& hx, const char* op) {
  TORCH_CHECK(gates.dim() == 2 && hx.dim() == 2, op, ": expected 2-D gates and hidden state, got ",
              gates.sizes(), " and ", hx.sizes());
  TORCH_CHECK(gates.size(0) == hx.size(0) && gates.size(1) == 3 * hx.size(1), op,
              ": gates of shape ", gates.sizes(), " do not match a hidden state of shape ",
              hx.sizes(), " (expected [batch, 3 * hidden])");
}

std::tuple<at::Tensor, at::Tensor> GruCellMeta(const at::Tensor& input_gates,
                                               const at::Tensor& hidden_gates,
                                               const at::Tensor& hx,
                                               const std::optional<at::Tensor>& input_bias,
                                               const std::optional<at::Tensor>& hidden_bias) {
  (void)input_bias;
  (void)hidden_bias;
  CheckGates(input_gates, hx, "_thnn_fused_gru_cell");
  TORCH_CHECK(hidden_gates.sizes() == input_gates.sizes(),
              "_thnn_fused_gru_cell: input and hidden gates differ in shape");
  at::Tensor hy = at::empty(hx.sizes(), hx.options());
  at::Tensor workspace = at::empty({hx.size(0), hx.size(1) * 5}, hx.options());
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> GruCellBackwardMeta(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  TORCH_CHECK(grad_hy.dim() == 2 && workspace.dim() == 2 &&
                  workspace.size(0) == grad_hy.size(0) &&
                  workspace.size(1) == 5 * grad_hy.size(1),
              "_thnn_fused_gru_cell_backward: workspace of shape ", workspace.sizes(),
              " does not match grad_hy of shape ", grad_hy.sizes());
  const int64_t batch = grad_hy.size(0), hidden = grad_hy.size(1);
  auto opts = grad_hy.options();
  at::Tensor grad_igates = at::empty({batch, 3 * hidden}, opts);
  at::Tensor grad_hgates = at::empty({batch, 3 * hidden}, opts);
  at::Tensor grad_hx = at::empty({batch, hidden}, opts);
  at::Tensor grad_b_ih, grad_b_hh;
  if (has_bias) {
    grad_b_ih = at::empty({3 * hidden}, opts);
    grad_b_hh = at::empty({3 * hidden}, opts);
  }
  return {grad_igates, grad_hgates, grad_hx, grad_b_ih, grad_b_hh};
}

std::tuple<at::Tensor, at::Tensor> GeqrfMeta(const at::Tensor& self) {
  TORCH_CHECK(self.dim() >= 2, "geqrf: input must have at least 2 dimensions.");
  auto sizes = self.sizes().vec();
  const int64_t k = std::min(sizes[sizes.size() - 2], sizes[sizes.size() - 1]);
  at::Tensor a = at::empty(self.sizes(), self.options());
  sizes.pop_back();
  sizes.back() = k;
  return {a, at::empty(sizes, self.options())};
}

// linalg_lstsq's shapes for driver "gels" (the default off the CPU, as on
// CUDA): solution [..., n, k] ([..., n] for a vector B), residuals [..., k]
// when m > n, empty rank and singular values. PyTorch has no meta kernel
// (its composite kernel calls linalg_lstsq.out, which has none either).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> LstsqMeta(
    const at::Tensor& A, const at::Tensor& B, std::optional<double> rcond,
    std::optional<c10::string_view> driver) {
  (void)rcond;
  TORCH_CHECK(A.dim() >= 2, "torch.linalg.lstsq: input must have at least 2 dimensions.");
  // Other drivers (gelsy, gelsd, gelss: CPU's LAPACK ones) are not native on
  // tpu: the rule declines them and the CPU fallback computes them (with
  // their own result shapes); these shapes are then not used.
  const bool gels = !driver.has_value() || *driver == "gels";
  const int64_t m = A.size(-2), n = A.size(-1);
  const bool vector_case =
      B.dim() == 1 || (B.dim() == A.dim() - 1 && B.sizes() == A.sizes().slice(0, A.dim() - 1));
  at::Tensor rhs = vector_case ? B.unsqueeze(-1) : B;
  TORCH_CHECK(rhs.size(-2) == m, "torch.linalg.lstsq: input.size(-2) should match other.size(-2)");
  auto batch = at::infer_size(A.sizes().slice(0, A.dim() - 2), rhs.sizes().slice(0, rhs.dim() - 2));
  const int64_t k = rhs.size(-1);
  std::vector<int64_t> sol(batch.begin(), batch.end()), res(batch.begin(), batch.end());
  sol.push_back(n);
  if (!vector_case) sol.push_back(k);
  res.push_back(k);
  auto opts = A.options().dtype(at::promote_types(A.scalar_type(), B.scalar_type()));
  // Residuals and singular values are real for complex inputs, as on CPU.
  auto real_opts = opts.dtype(c10::toRealValueType(opts.dtype().toScalarType()));
  at::Tensor residuals = m > n && gels ? at::empty(res, real_opts) : at::empty({0}, real_opts);
  return {at::empty(sol, opts), residuals, at::empty({0}, opts.dtype(at::kLong)),
          at::empty({0}, real_opts)};
}

// _logcumsumexp: the input's shape and dtype.
at::Tensor LogCumSumExpMeta(const at::Tensor& self, int64_t dim) {
  (void)at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  return at::empty(self.sizes(), self.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_logcumsumexp", LogCumSumExpMeta);
  m.impl("linalg_lstsq", LstsqMeta);
  m.impl("geqrf", GeqrfMeta);
  m.impl("_thnn_fused_gru_cell", GruCellMeta);
  m.impl("_thnn_fused_gru_cell_backward", GruCellBackwardMeta);
}

}  // namespace torch_tpu::aten
