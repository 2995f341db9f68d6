// The eval-mode fast paths of nn.TransformerEncoderLayer and
// nn.MultiheadAttention on tpu: _transformer_encoder_layer_fwd and
// _native_multi_head_attention, composed of native ops the way ATen's CPU
// kernels compute them (aten/src/ATen/native/transformers/): a packed QKV
// projection, per-head scaled scores, a masked softmax (mask entries that are
// True or nonzero are masked out; mask_type 0: [L, S], 1: key padding
// [B, S], 2: [B, H, L, S]; a row with every key masked gives zeros), the
// output projection, and for the layer the residuals, layer norms and the
// relu/gelu feed-forward. Without these the fast path ran on the CPU.
#include <cmath>

#include <torch/library.h>

#include "aten/tpu.h"

namespace torch_tpu::aten {
namespace {

// [B, T, E] -> [B, H, T, E/H]
at::Tensor SplitHeads(const at::Tensor& x, int64_t num_heads) {
  return x.view({x.size(0), x.size(1), num_heads, x.size(2) / num_heads}).transpose(1, 2);
}

// Boolean "masked out" mask broadcastable to [B, H, L, S].
at::Tensor ExpandMask(const at::Tensor& mask, std::optional<int64_t> mask_type, int64_t B,
                      int64_t H, int64_t L, int64_t S) {
  at::Tensor m = mask.scalar_type() == at::kBool ? mask : mask.ne(0);
  if (mask_type.has_value() && *mask_type == 1) {
    TORCH_CHECK(m.dim() == 2, "native multi-head attention: a key padding mask must be [B, S]");
    m = m.view({m.size(0), 1, 1, m.size(1)});
  }
  return m.expand({B, H, L, S});
}

std::tuple<at::Tensor, at::Tensor> NativeMha(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t embed_dim,
    int64_t num_head, const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
    const at::Tensor& proj_weight, const at::Tensor& proj_bias,
    const std::optional<at::Tensor>& mask, bool need_weights, bool average_attn_weights,
    std::optional<int64_t> mask_type) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3,
              "_native_multi_head_attention: expected batch-first [B, T, E] query, key and value");
  TORCH_CHECK(embed_dim % num_head == 0, "_native_multi_head_attention: embed_dim ", embed_dim,
              " is not divisible by num_heads ", num_head);
  auto w = qkv_weight.chunk(3, 0);
  auto b = qkv_bias.chunk(3, 0);
  const int64_t B = query.size(0), L = query.size(1), S = key.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(embed_dim / num_head));
  at::Tensor q = SplitHeads(at::linear(query, w[0], b[0]), num_head) * scale;
  at::Tensor k = SplitHeads(at::linear(key, w[1], b[1]), num_head);
  at::Tensor v = SplitHeads(at::linear(value, w[2], b[2]), num_head);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));  // [B, H, L, S]
  at::Tensor attn;
  if (mask.has_value() && mask->defined()) {
    at::Tensor masked = ExpandMask(*mask, mask_type, B, num_head, L, S);
    scores = scores.masked_fill(masked, -std::numeric_limits<double>::infinity());
    attn = at::softmax(scores, -1).masked_fill(masked.all(-1, /*keepdim=*/true), 0);
  } else {
    attn = at::softmax(scores, -1);
  }
  at::Tensor ctx = at::matmul(attn, v).transpose(1, 2).reshape({B, L, embed_dim});
  at::Tensor out = at::linear(ctx, proj_weight, proj_bias);
  if (!need_weights) return {out, at::Tensor()};
  return {out, average_attn_weights ? attn.sum(1) / num_head : attn};
}

at::Tensor Norm(const at::Tensor& x, int64_t embed_dim, double eps, const at::Tensor& w,
                const at::Tensor& b) {
  return at::layer_norm(x, {embed_dim}, w, b, eps, true);
}

at::Tensor EncoderLayer(const at::Tensor& src, int64_t embed_dim, int64_t num_heads,
                        const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
                        const at::Tensor& proj_weight, const at::Tensor& proj_bias, bool use_gelu,
                        bool norm_first, double eps, const at::Tensor& ln1_w,
                        const at::Tensor& ln1_b, const at::Tensor& ln2_w, const at::Tensor& ln2_b,
                        const at::Tensor& ffn_w1, const at::Tensor& ffn_b1,
                        const at::Tensor& ffn_w2, const at::Tensor& ffn_b2,
                        const std::optional<at::Tensor>& mask, std::optional<int64_t> mask_type) {
  TORCH_CHECK(!src.is_nested(), "_transformer_encoder_layer_fwd: nested tensors are not supported on tpu");
  if (src.numel() == 0) return src.clone();
  at::Tensor x = norm_first ? Norm(src, embed_dim, eps, ln1_w, ln1_b) : src;
  x = std::get<0>(NativeMha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                            proj_bias, mask, false, true, mask_type)) + src;
  if (!norm_first) x = Norm(x, embed_dim, eps, ln1_w, ln1_b);
  at::Tensor residual = x;
  if (norm_first) x = Norm(x, embed_dim, eps, ln2_w, ln2_b);
  x = at::linear(x, ffn_w1, ffn_b1);
  x = use_gelu ? at::gelu(x) : at::relu(x);
  x = at::linear(x, ffn_w2, ffn_b2) + residual;
  if (!norm_first) x = Norm(x, embed_dim, eps, ln2_w, ln2_b);
  return x;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_native_multi_head_attention", NativeMha);
  m.impl("_transformer_encoder_layer_fwd", EncoderLayer);
}

}  // namespace torch_tpu::aten
