// Meta kernels (output shapes) of the fused GRU cell and its backward.
// PyTorch ships meta kernels for the fused LSTM cell ops but none for these
// two CUDA-only ops; the generic tpu kernel (and torch.compile's fake
// tensors) size the outputs through them. Shapes follow CUDA's kernels
// (aten/src/ATen/native/cuda/RNN.cu): the workspace is [batch, 5 * hidden].
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

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_thnn_fused_gru_cell", GruCellMeta);
  m.impl("_thnn_fused_gru_cell_backward", GruCellBackwardMeta);
}

}  // namespace torch_tpu::aten
