// Explicit PrivateUse1 kernels for ops the generic dispatcher cannot serve
// by itself, each built from ops that do have lowering rules:
//
// - Data-dependent output shapes (nonzero, masked_select, _unique2, x[mask],
//   repeat_interleave without output_size): the meta kernels cannot know the
//   size, so these kernels read ONE count back from the device (a sync, like
//   CUDA's nonzero) and then call static-size ops (nonzero_static,
//   _unsafe_index, index_select, ...).
// - Scaled dot-product attention: sdpa asks _fused_sdp_choice_stub for a
//   backend; for tpu tensors it answers "overrideable", whose forward returns
//   SymInts (max_q, max_k) that the generic dispatcher cannot produce. The
//   kernels below call _scaled_dot_product_efficient_attention(_backward),
//   lowered in lowering/attention.cpp, and repackage the results.
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <torch/library.h>

#include "aten/tpu.h"

namespace torch_tpu::aten {
namespace {

bool IsTpu(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// ---------------------------------------------------------------- attention

constexpr int64_t kMath = static_cast<int64_t>(sdp::SDPBackend::math);
constexpr int64_t kOverrideable = static_cast<int64_t>(sdp::SDPBackend::overrideable);

int64_t FusedSdpChoice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& mask, double /*dropout_p*/,
                       bool /*is_causal*/, std::optional<double> /*scale*/, bool enable_gqa) {
  auto& ctx = at::globalContext();
  if (!ctx.userEnabledOverrideableSDP()) return kMath;
  if (!IsTpu(q) || !IsTpu(k) || !IsTpu(v)) return kMath;
  if (q.is_nested() || k.is_nested() || v.is_nested()) return kMath;
  int64_t d = q.dim();
  if ((d != 3 && d != 4) || k.dim() != d || v.dim() != d) return kMath;
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type()) return kMath;
  if (!at::isFloatingType(q.scalar_type())) return kMath;
  // Symbolic sizes (Dynamo traces this with fake tensors): comparing two
  // sizes guards on their relation; reading one as an int would specialize
  // the graph to it (one graph per sequence length under dynamic=True).
  if (d == 4 && (k.sym_size(0) != q.sym_size(0) || v.sym_size(0) != q.sym_size(0))) return kMath;
  c10::SymInt hq = q.sym_size(-3), hk = k.sym_size(-3);
  if (v.sym_size(-3) != hk || k.sym_size(-2) != v.sym_size(-2) || k.sym_size(-1) != q.sym_size(-1))
    return kMath;
  if (hk == 0 || hq % hk != 0 || (hq != hk && !enable_gqa)) return kMath;
  if (mask.has_value() && mask->defined()) {
    if (mask->dim() > 4 || !IsTpu(*mask)) return kMath;
  }
  return kOverrideable;
}

int64_t FusedSdpChoiceOp(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  return FusedSdpChoice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
           at::Tensor, at::Tensor>
SdpaOverrideable(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                 const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                 bool /*return_debug_mask*/, std::optional<double> scale) {
  bool three = query.dim() == 3;
  at::Tensor q = three ? query.unsqueeze(0) : query;
  at::Tensor k = three ? key.unsqueeze(0) : key;
  at::Tensor v = three ? value.unsqueeze(0) : value;
  // The logsumexp is for backward only: without a gradient to compute, an
  // unwritten tensor of its shape (and the kernel may run dynamic shapes).
  bool backward = at::GradMode::is_enabled() &&
                  (q.requires_grad() || k.requires_grad() || v.requires_grad() ||
                   (attn_bias && attn_bias->requires_grad()));
  auto [out, lse, seed, offset] = at::_scaled_dot_product_efficient_attention(
      q, k, v, attn_bias, /*compute_log_sumexp=*/backward, dropout_p, is_causal, scale);
  int64_t L = q.size(2), S = k.size(2);
  lse = backward ? lse.narrow(2, 0, L) : at::empty({q.size(0), q.size(1), L}, q.options().dtype(at::kFloat));
  if (three) out = out.squeeze(0);
  return {out, lse, at::Tensor(), at::Tensor(), c10::SymInt(L), c10::SymInt(S), seed, offset,
          at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> SdpaOverrideableBackward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask,
    const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& /*cum_seq_q*/,
    const at::Tensor& /*cum_seq_k*/, c10::SymInt /*max_q*/, c10::SymInt /*max_k*/,
    double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, std::optional<double> scale) {
  bool three = query.dim() == 3;
  auto four = [&](const at::Tensor& t) { return three ? t.unsqueeze(0) : t; };
  at::Tensor g = four(grad_out), q = four(query), k = four(key), v = four(value), o = four(out);
  int64_t B = q.size(0), hq = q.size(1), hk = k.size(1), G = hk > 0 ? hq / hk : 1;
  // The backward op's gradients have the query's head count: give it key and
  // value repeated per group, and sum the groups afterwards.
  at::Tensor ke = k, ve = v;
  if (G != 1) {
    ke = k.unsqueeze(2).expand({B, hk, G, k.size(2), k.size(3)}).reshape({B, hq, k.size(2), k.size(3)});
    ve = v.unsqueeze(2).expand({B, hk, G, v.size(2), v.size(3)}).reshape({B, hq, v.size(2), v.size(3)});
  }
  // A 1-element zero bias when there is none. The bias gradient only when
  // asked for a float bias: its meta result is a window of rows aligned to
  // 16, a layout bounded-dynamic results do not take (exact shapes then).
  bool has_bias = attn_bias.defined();
  at::Tensor bias = has_bias ? attn_bias : at::zeros({1, 1, 1, 1}, q.options());
  bool bias_grad = has_bias && grad_input_mask[3] && at::isFloatingType(attn_bias.scalar_type());
  auto [dq, dk, dv, db] = at::_scaled_dot_product_efficient_attention_backward(
      g, q, ke, ve, bias, o, logsumexp, philox_seed, philox_offset, dropout_p,
      {true, true, true, bias_grad}, is_causal, scale);
  if (G != 1) {
    dk = dk.reshape({B, hk, G, k.size(2), k.size(3)}).sum(2);
    dv = dv.reshape({B, hk, G, v.size(2), v.size(3)}).sum(2);
  }
  if (three) {
    dq = dq.squeeze(0);
    dk = dk.squeeze(0);
    dv = dv.squeeze(0);
  }
  return {dq, dk, dv, bias_grad ? db : at::Tensor()};
}

// ---------------------------------------------------------------- nonzero

// The number of nonzero elements: one device -> host read.
int64_t CountNonzero(const at::Tensor& self) {
  return self.ne(0).sum().item<int64_t>();
}

at::Tensor Nonzero(const at::Tensor& self) {
  return at::nonzero_static(self, CountNonzero(self), -1);
}

at::Tensor MaskedSelect(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  auto shape = at::infer_size(self.sizes(), mask.sizes());
  at::Tensor m = mask.to(self.device()).expand(shape).reshape({-1});
  at::Tensor x = self.expand(shape).reshape({-1});
  at::Tensor pos = at::nonzero_static(m, CountNonzero(m), -1).view({-1});
  return x.index_select(0, pos);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> Unique2(const at::Tensor& self, bool /*sorted*/,
                                                       bool return_inverse, bool return_counts) {
  auto long_opts = self.options().dtype(at::kLong);
  at::Tensor flat = self.reshape({-1});
  int64_t n = flat.numel();
  if (n == 0) {
    return {at::empty({0}, self.options()),
            return_inverse ? at::empty(self.sizes(), long_opts) : at::empty({0}, long_opts),
            at::empty({0}, long_opts)};
  }
  auto [sorted_vals, perm] = flat.sort(/*stable=*/true, 0, false);
  // first[i]: sorted[i] starts a new value.
  at::Tensor first = at::ones({1}, self.options().dtype(at::kBool));
  if (n > 1)
    first = at::cat({first, sorted_vals.slice(0, 1, n).ne(sorted_vals.slice(0, 0, n - 1))});
  int64_t count = first.sum().item<int64_t>();
  at::Tensor starts = at::nonzero_static(first, count, -1).view({-1});
  at::Tensor values = sorted_vals.index_select(0, starts);
  at::Tensor inverse = at::empty({0}, long_opts), counts = at::empty({0}, long_opts);
  if (return_inverse) {
    at::Tensor ranks = first.to(at::kLong).cumsum(0).sub(1);
    inverse = at::zeros({n}, long_opts).scatter(0, perm, ranks).view(self.sizes());
  }
  if (return_counts) {
    at::Tensor ends = at::cat({starts.slice(0, 1, count), at::full({1}, n, long_opts)});
    counts = ends.sub(starts);
  }
  return {values, inverse, counts};
}

// ---------------------------------------------------------------- indexing

// x[indices]: bool / uint8 masks become int indices (nonzero, one sync),
// CPU index tensors move to the device, then _unsafe_index (a lowering rule,
// with bounds checks) gathers.
at::Tensor Index(const at::Tensor& self_, const c10::List<std::optional<at::Tensor>>& indices) {
  at::Tensor self = self_;
  c10::List<std::optional<at::Tensor>> converted;
  int64_t dim = 0;
  for (const auto& entry : indices) {
    std::optional<at::Tensor> opt = entry;
    if (!opt.has_value() || !opt->defined()) {
      converted.push_back(std::nullopt);
      ++dim;
      continue;
    }
    at::Tensor t = *opt;
    if (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte) {
      if (t.dim() == 0) {  // x[True] / x[False]: a new dim of size 1 or 0
        self = self.unsqueeze(dim);
        int64_t keep = t.item<bool>() ? 1 : 0;
        converted.push_back(at::zeros({keep}, self.options().dtype(at::kLong)));
        ++dim;
        continue;
      }
      TORCH_CHECK_INDEX(dim + t.dim() <= self.dim(), "too many indices for tensor of dimension ",
                        self.dim());
      for (int64_t j = 0; j < t.dim(); ++j)
        TORCH_CHECK_INDEX(t.size(j) == self.size(dim + j), "The shape of the mask ", t.sizes(),
                          " at index ", j, " does not match the shape of the indexed tensor ",
                          self.sizes(), " at index ", dim + j);
      // nonzero on a CPU mask needs no sync at all.
      at::Tensor nz = IsTpu(t) ? at::nonzero(t) : at::nonzero(t).to(self.device());
      for (int64_t j = 0; j < t.dim(); ++j) converted.push_back(nz.select(1, j));
      dim += t.dim();
      continue;
    }
    converted.push_back(IsTpu(t) ? t : t.to(self.device()));
    ++dim;
  }
  return at::_unsafe_index(self, converted);
}

// repeat_interleave.Tensor(repeats, *, output_size=None): out[j] = i for the
// repeats[i] positions of i, via a scatter of segment starts and a cumsum.
at::Tensor RepeatInterleave(const at::Tensor& repeats, std::optional<c10::SymInt> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK(repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
              "repeats has to be Long or Int tensor");
  auto opts = repeats.options().dtype(repeats.scalar_type());
  int64_t total;
  if (output_size.has_value()) {
    total = output_size->expect_int();
  } else {
    if (repeats.numel() == 0) return at::empty({0}, opts);
    at::Tensor stats = at::stack({repeats.sum().to(at::kLong), repeats.min().to(at::kLong)}).cpu();
    TORCH_CHECK(stats[1].item<int64_t>() >= 0, "repeats can not be negative");
    total = stats[0].item<int64_t>();
  }
  if (total == 0 || repeats.numel() == 0) return at::empty({0}, opts);
  at::Tensor ends = repeats.to(at::kLong).cumsum(0);
  at::Tensor marks = at::zeros({total + 1}, repeats.options().dtype(at::kLong));
  marks = marks.index_add(0, ends, at::ones_like(ends));
  return marks.narrow(0, 0, total).cumsum(0).to(repeats.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", FusedSdpChoiceOp);
  m.impl("_scaled_dot_product_fused_attention_overrideable", SdpaOverrideable);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", SdpaOverrideableBackward);
  m.impl("nonzero", Nonzero);
  m.impl("masked_select", MaskedSelect);
  m.impl("_unique2", Unique2);
  m.impl("index.Tensor", Index);
  m.impl("repeat_interleave.Tensor", RepeatInterleave);
}

}  // namespace torch_tpu::aten

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_tpu::aten::FusedSdpChoice);
}  // namespace at::native
