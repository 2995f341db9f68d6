// Bounded dynamic shapes in strict eager: new sizes of a known op signature
// stop compiling.
//
// Policy (like Dynamo's automatic dynamic shapes). The signature of a call is
// its exact-shape cache key with every input's geometry replaced by its rank
// and which dims are 1 (rule, dtypes, baked attributes, aliasing, scalar
// kinds, precision and device stay). The first sizes a signature sees compile
// static, exactly as before. A later call with another size in some dim makes
// that dim dynamic for the signature (sticky): the call runs on one
// executable bounded by the size's bucket, the real sizes passed as runtime
// i32 parameters; XLA's dynamic padder masks reductions and contractions.
// Sizes inside the bucket hit that executable; a size past it compiles the
// next bucket. Sizes already compiled static keep their static executable.
//
// Buckets: 4, 8 and 16 for sizes up to 16, else the size rounded up to a
// multiple of 2^(floor(log2 s) - 3), i.e. 8 buckets per octave (16, 18, 20,
// ..., 30, 32, 36, 40, ...): a dynamic dim above 16 is padded by less than
// 12.5% (2 dynamic dims: < 26.6%). A small size takes the smallest small
// bucket its dim has already run at that holds it (a batch of 3 after
// batches 4 and 5 runs in their 8-bucket), so small sizes below a warm
// bucket compile nothing while a small batch alone pads to at most 2x.
// A dim that merges padded dims of its storage (an image's h*w pixels read
// as tokens) takes the product of their padded sizes instead, and storages
// that keep such a product hand it on to their readers (ProductBuckets): two
// image sizes in one bucket share their tokens' bucket too.
//
// Storage (runtime.h DeviceStorage::padded_shape): a dynamic op's result
// keeps its buffer at its bound's bucket, the real elements at the front of
// each padded dim, so the next dynamic op takes it as it is; only a chain's
// first op pads its exact input (through the host: an exact buffer's type
// changes with every size). PyTorch sees exact storages (nbytes, data_ptr,
// views, strides); exact readers slice or compact the real elements out.
// A dynamic op reads views too: any permutation of windows of its storage's
// dims (padded_layout.h), e.g. heads split out and transposed, RoPE halves,
// a table cut to the sequence length, a KV cache whose buffer is larger than
// the reader's bucket.
//
// What runs dynamic: the rules marked Dynamic() in the lowering table
// (RuleEntry::dynamic: elementwise, reductions, softmax, matmul, clone, cat,
// stack, constant_pad_nd, embedding and its backward, masked_fill, cumsum,
// isin, norms, losses, dropout, attention and its backward in their batch and
// sequence dims, convolutions and poolings in their batch and spatial dims,
// run static at the bucket on filled padding; a rule states which dims it
// keeps static), in their
// functional form when the outputs are dense, and in their in-place forms on
// whole storages (fills, copies, elementwise updates: the result becomes the
// storage's padded buffer; a fill's or copy's destination is never laid out
// first) or on windows of padded storages whose dynamic dims cover the real
// elements (the result is written into the window of the padded layout:
// RoPE's slice_backward). Calls of a signature
// from different places keep separate size variants (a head count never turns
// dynamic because a sequence length did); parameters never turn dynamic.
// Random draws run dynamic where the rule draws at its inputs' real sizes
// (dropout, attention's dropout: lowering::RandomBits counts each element's
// bits from its index among the real elements, so the bucket draws what the
// exact shape draws). Everything else (out= variants, in-place writes to
// part of an exact storage, other random draws, integer pow) keeps exact shapes. A dynamic module
// XLA rejects turns its signature back to exact shapes (correct first).
// debug.report() says why an op ran exact (exact_reasons).
//
// Output specs: a new size of a signature that ran dynamic takes its exact
// output sizes and strides from what the signature learnt of its sizes
// (spec_model.cpp: DerivedSpecs, planned before ComputeOutputs), not from
// PyTorch's meta kernel, which cost most of a first call.
//
// Fused eager: a call whose signature has gone dynamic runs alone on its
// bounded executable (the chain runs first when the call reads one of its
// values or writes a storage it holds: SettleRecordingFor); the chain records
// the calls around it, reading a padded storage's window out of its buffer as
// strict eager does, so a chain of fixed sizes (decode's q/k/v projections,
// the lm_head on the last position) compiles once for every length. A call
// whose exact sizes a chain already recorded stays recorded. Compiled graphs
// are bounded by compile_symbolic.py, not here.
//
// Controls: TORCH_TPU_DYNAMIC_SHAPES=auto (the default: the policy above),
// 0 (exact shapes), 1 (every dim of size > 1 dynamic from the first call);
// torch_tpu.dynamic.set_mode() at run time.
//
// Hints (torch_tpu.mark_dynamic / mark_static), in every mode: a marked
// dynamic dim (size > 1) runs bounded from the first call, at `max` when
// given and the size fits, else at its bucket; a marked static dim never runs
// dynamic (nor counts as a second size). The hints live on the TensorImpl
// (its BackendMeta slot); the results of a call a hint made dynamic carry
// the hint on the dims that follow it, so a chain of ops stays dynamic.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "aten/call.h"
#include "aten/dynamic.h"
#include "aten/padded_layout.h"

namespace torch_tpu::aten {

using hlo::ElementType;
using hlo::TensorType;
using hlo::Value;
using lowering::Arg;

namespace {

DynamicMode ParseMode(const std::string& v) {
  if (v == "auto") return DynamicMode::Auto;
  if (v == "1") return DynamicMode::All;
  if (v.empty() || v == "0") return DynamicMode::Off;
  throw std::invalid_argument("TORCH_TPU_DYNAMIC_SHAPES must be auto, 0 or 1, got '" + v + "'");
}

DynamicMode& ModeRef() {
  static DynamicMode mode = [] {
    const char* v = std::getenv("TORCH_TPU_DYNAMIC_SHAPES");
    return ParseMode(v ? v : "auto");
  }();
  return mode;
}

bool g_any_hints = false;  // some tensor was ever marked

void UpdateActive() { g_dynamic_active = ModeRef() != DynamicMode::Off || g_any_hints; }

// One dim's hint.
struct DimHint {
  bool dynamic = false;  // false: static
  int64_t min = -1, max = -1;  // -1: none
};

// The hints of one tensor, in its TensorImpl's BackendMeta slot (cloned with
// the impl's extra meta, e.g. by detach()).
struct DynamicHints : c10::BackendMeta {
  std::map<int64_t, DimHint> dims;
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>& ptr) const override {
    auto copy = c10::make_intrusive<DynamicHints>();
    copy->dims = static_cast<const DynamicHints*>(ptr.get())->dims;
    return copy;
  }
};

const DynamicHints* HintsOf(const at::Tensor& t) {
  if (!g_any_hints) return nullptr;
  return dynamic_cast<const DynamicHints*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

// A view's hints, from its base's (a view carries none of its own): a view
// dim that is one base dim keeps its hint; one that merges hinted-dynamic
// base dims (x marked in s, read as [b*s, h] by a linear) is dynamic, bounded
// by the product of their bounds (the sizes of unhinted ones). Slices of a
// dim, and views of non-contiguous bases, take no hint.
std::optional<DynamicHints> ViewHintsOf(const at::Tensor& t) {
  if (!t.is_view()) return std::nullopt;
  const at::Tensor base(t._base());
  const DynamicHints* hb = HintsOf(base);
  if (!hb || !base.is_contiguous()) return std::nullopt;
  const auto sizes = base.sizes(), strides = base.strides();
  DynamicHints out;
  for (int64_t k = 0; k < t.dim(); ++k) {
    const int64_t n = t.size(k), stride = t.stride(k);
    if (n <= 1) continue;
    int64_t last = -1;  // the innermost base dim of the span: its stride is the view dim's
    for (int64_t j = 0; j < base.dim(); ++j)
      if (strides[j] == stride && sizes[j] > 1) last = j;
    if (last < 0) continue;
    int64_t first = last, product = sizes[last];
    while (product < n && first > 0) product *= sizes[--first];
    if (product != n) continue;
    bool dynamic = false, fixed = false;
    int64_t max = 1;
    for (int64_t j = first; j <= last; ++j) {
      auto h = hb->dims.find(j);
      const bool hinted = h != hb->dims.end();
      dynamic |= hinted && h->second.dynamic;
      fixed |= hinted && !h->second.dynamic;
      max = max < 0 || (hinted && h->second.dynamic && h->second.max < 0) ? -1
                                                                         : max * (hinted && h->second.max >= 0 ? h->second.max : sizes[j]);
    }
    if (dynamic) out.dims[k] = DimHint{true, -1, max};
    else if (fixed && first == last) out.dims[k] = DimHint{false, -1, -1};
  }
  if (out.dims.empty()) return std::nullopt;
  return out;
}

DynamicHints& MutableHints(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (auto* h = dynamic_cast<DynamicHints*>(impl->get_backend_meta())) return *h;
  auto h = c10::make_intrusive<DynamicHints>();
  DynamicHints* raw = h.get();
  impl->set_backend_meta(std::move(h));
  g_any_hints = true;
  UpdateActive();
  return *raw;
}

constexpr int64_t kSmallBucket = 16;

int64_t Bucket(int64_t s) {
  if (s <= 16) return s <= 4 ? 4 : (s <= 8 ? 8 : 16);
  int64_t k = 0;
  while ((int64_t{1} << (k + 1)) <= s) ++k;  // k = floor(log2 s)
  int64_t step = int64_t{1} << (k - 3);
  return (s + step - 1) / step * step;
}

// Per input, per dim, of one call: the hints of its tensor (none: default).
using CallHints = std::vector<std::vector<std::optional<DimHint>>>;

// One family of calls of a signature: the first sizes of each input, and
// which input dims are dynamic.
struct SizeVariant {
  std::vector<std::vector<int64_t>> first;
  std::vector<std::vector<bool>> dynamic;
};

// What a signature has seen. Calls from different places of a model share a
// signature (two bmm's of attention, a [b, h, s, d] and a [b, s, h, d]
// clone): each keeps its own variant, so that a head count never turns
// dynamic because a sequence length did elsewhere.
struct SignatureState {
  std::vector<SizeVariant> variants;
  // Per (input, dim): the small buckets (<= kSmallBucket) it has run at. A
  // small size takes the smallest of them that holds it (a batch of 3 after
  // batches 4 and 5 takes their bucket 8: no compile); see SmallBucket().
  std::map<std::pair<size_t, size_t>, std::set<int64_t>> small_buckets;
  // Per (input, dim): the larger buckets it has run at (WarmerBuckets).
  std::map<std::pair<size_t, size_t>, std::set<int64_t>> large_buckets;
  // Per (input, storage dim): the buckets an exact storage's dim read at one
  // element has taken (ReadBucket).
  std::map<std::pair<size_t, size_t>, std::set<int64_t>> read_buckets;
  // The signatures of its family, itself included (JoinFamily).
  std::vector<const SignatureState*>* siblings = nullptr;
  // (input, dim) pairs kept static: a partial write's window that stops
  // short of its storage dim's end (PinShortWrites).
  std::set<std::pair<size_t, size_t>> pinned;
  bool exact_only = false;  // a dynamic module failed: exact shapes from now on
  const char* exact_because = "";  // ... why (ExecutableFor)
};

// A compiled bounded-dynamic executable and what launching it needs.
struct DynamicCompiled {
  pjrt::ExecutablePtr exe;
  std::vector<std::vector<bool>> out_dynamic;  // per output, per dim
  std::vector<std::vector<int64_t>> out_bucket;  // per output: its sizes in the executable
  std::vector<std::vector<int64_t>> out_order;   // per output: its dims in storage order
  std::vector<std::vector<int64_t>> out_buffer;  // per output: the sizes its storage keeps
  std::vector<std::vector<bool>> out_product;    // per output dim: its buffer a product of buckets (ProductBuckets)
  std::vector<std::string> checks;  // device assertions (results before the outputs), op-prefixed
};

struct DynamicState {
  std::unordered_map<std::string, SignatureState> signatures;
  // Signatures by family (Signature()'s `family`: the same op at other unit dims).
  std::unordered_map<std::string, std::vector<const SignatureState*>> families;
  std::unordered_map<std::string, DynamicCompiled> executables;
  std::unordered_map<std::string, std::vector<OutputSpec>> specs;  // exact key -> real specs
  std::unordered_set<std::string> failed;  // dynamic keys of hinted layouts XLA or meta refused
  DynamicCounters counters;
  int64_t generation = -1;
};

DynamicState& State() {
  static auto* s = new DynamicState();
  return *s;
}

DynamicCounters& Counters() {
  DynamicState& s = State();
  int64_t g = GetRuntime().stats_generation();
  if (s.generation != g) {
    s.counters = DynamicCounters();
    s.generation = g;
  }
  return s.counters;
}

// The order of a view's dims by stride (outermost first), size-1 dims as '-'.
void AppendStrideOrder(const lowering::ViewGeometry& g, std::string* sig) {
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.sizes[d] == 1) {
      *sig += '-';
      continue;
    }
    int rank = 0;
    for (size_t e = 0; e < g.sizes.size(); ++e) rank += g.sizes[e] != 1 && g.strides[e] > g.strides[d];
    *sig += static_cast<char>('a' + rank);
  }
}

// The real element offset of input `in` in its storage.
int64_t OffsetOf(const Plan& plan, const TensorIn& in) {
  return in.offset_param >= 0 ? plan.params[in.offset_param].offset : 0;
}

// Whether input `in` reads a window at the front of its storage laid out
// row-major (offset 0, strides outermost first, the innermost 1).
bool FrontWindow(const Plan& plan, const TensorIn& in) {
  const lowering::ViewGeometry& g = in.geometry;
  if (OffsetOf(plan, in) != 0) return false;
  int64_t inner = 0;  // the stride of the next non-unit dim inside, 0: none yet
  for (size_t d = g.sizes.size(); d-- > 0;) {
    if (g.sizes[d] == 1) continue;
    if (inner == 0 ? g.strides[d] != 1 : g.strides[d] < inner) return false;
    inner = g.strides[d] * g.sizes[d];
  }
  return true;
}

// Per input: a front window of a tensor arg the rule reads whole or cut
// alike (DynamicShapes::front_window_args: attention's saved logsumexp).
std::vector<bool> FrontWindowInputs(const Call& call) {
  const Plan& plan = call.plan;
  std::vector<bool> front(plan.inputs.size(), false);
  for (size_t a : call.desc->rule->dynamic.front_window_args) {
    if (a >= plan.args.size() || plan.args[a].kind != Arg::Kind::Tensor || plan.args[a].tensors.empty()) continue;
    int i = plan.args[a].tensors[0];
    if (i >= 0) front[i] = FrontWindow(plan, plan.inputs[i]);
  }
  return front;
}

// `fixed`: per input, its sizes stay in the signature (a parameter).
// `front`: per input, a front window keyed as a whole read (FrontWindowInputs).
// `family`: when given, the signature without its unit dims and stride
// orders (SiblingVariant: batch 1 and batch 4 of one op are one family).
std::string Signature(const Plan& plan, const std::vector<bool>& fixed, const std::vector<bool>& front,
                      std::string* family = nullptr) {
  std::string sig, fam;
  auto append = [&](const std::string& text, size_t from, size_t count) {
    sig.append(text, from, count);
    if (family) fam.append(text, from, count);
  };
  auto sizes = [&](const std::vector<int64_t>& dims) {
    for (int64_t d : dims) {
      sig += d == 1 ? '1' : (d == 0 ? '0' : 'x');
      if (family) fam += d == 0 ? '0' : 'x';
    }
  };
  size_t at = 0;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    auto [begin, end] = plan.geometry_spans[i];
    if (fixed[i]) continue;
    const lowering::ViewGeometry& g = plan.inputs[i].geometry;
    const bool whole = g.whole || front[i];
    append(plan.key, at, begin - at);
    append(whole ? "r" : "v", 0, 1);
    sizes(g.sizes);
    if (!whole) AppendStrideOrder(g, &sig);
    at = end;
  }
  // In-place destinations: their dtype, rank and unit dims, as the inputs'.
  if (plan.dest_span.second > plan.dest_span.first && at <= plan.dest_span.first) {
    append(plan.key, at, plan.dest_span.first - at);
    for (const Dest& d : plan.dests) {
      append("W" + std::string(hlo::Name(d.dtype)) + (d.geometry.whole ? "r" : "v"), 0, std::string::npos);
      sizes(d.geometry.sizes);
    }
    at = plan.dest_span.second;
  }
  append(plan.key, at, std::string::npos);
  if (family) *family = std::move(fam);
  return sig;
}

// Whether the call draws random numbers; a random rule may draw none for
// these arguments (an attention without dropout).
bool DrawsRandomBits(const Call& call) {
  return !call.desc->rule || !call.desc->rule->random() || RngDraws(call) != 0;
}

// Whether the call draws random numbers at its exact shape only (a rule
// that does not draw at its inputs' real sizes: at the bucket's sizes its
// bits would not be the exact shape's). Only a call with a generator state
// (a Rng parameter or a Generator arg) draws.
bool DrawsAtExactShape(const Call& call) {
  if (call.desc->rule && call.desc->rule->dynamic.draws_at_real_sizes) return false;
  const Plan& plan = call.plan;
  const bool rng = std::any_of(plan.params.begin(), plan.params.end(),
                               [](const Param& q) { return q.kind == Param::Kind::Rng; }) ||
                   std::any_of(plan.args.begin(), plan.args.end(),
                               [](const ArgPlan& a) { return a.kind == Arg::Kind::Generator; });
  return rng && DrawsRandomBits(call);
}


// Why the last strict-eager call of this thread ran exact shapes (read by
// CountCompile when that call compiled: debug.report() names it).
thread_local const char* t_exact_reason = "dynamic shapes off (TORCH_TPU_DYNAMIC_SHAPES=0)";

bool Refuse(const char* reason) {
  t_exact_reason = reason;
  return false;
}

// The destination and dim of the last partial write WritesFit refused on
// this thread (dest -1: none).
struct ShortWrite {
  int dest = -1;
  size_t dim = 0;
};
thread_local ShortWrite t_short_write;

// An in-place call runs dynamic when each destination is a storage of its
// own: a whole one takes the result as its new (padded) buffer, a window of
// one has the result written into its padded layout (PartialWrites). Fresh
// outputs beside them (batch norm's, beside its running statistics) are
// fresh tensors.
bool OwnDestinations(const Call& call) {
  const auto& dests = call.plan.dests;
  if (dests.size() != call.specs.size()) return false;
  for (size_t i = 0; i < dests.size(); ++i) {
    if (!dests[i].tensor.defined()) continue;
    for (size_t j = 0; j < i; ++j)
      if (dests[j].tensor.defined() && dests[j].storage == dests[i].storage) return false;
  }
  return true;
}

// Whether result k is written into part of an existing storage (its
// strides are the window's: PartialWrites lays it out).
bool PartialDestination(const Call& call, size_t k) {
  const auto& dests = call.plan.dests;
  return k < dests.size() && dests[k].tensor.defined() && !dests[k].geometry.whole;
}

// Whether the call writes a window of a padded storage (a select's backward
// copying a gradient into row 0 of zeros padded at a bucket): at sizes no
// dim of the call changed, the bounded path writes it into the buffer's
// layout, where the exact path would key the storage's real size.
bool WritesPaddedWindow(const Call& call) {
  for (size_t k = 0; k < call.specs.size(); ++k)
    if (PartialDestination(call, k) && call.plan.storages[call.plan.dests[k].storage]->padded()) return true;
  return false;
}

bool Eligible(const Call& call) {
  const Plan& plan = call.plan;
  if (call.desc->variant == Variant::Out) return Refuse("out= variant");
  if (call.desc->variant == Variant::InPlace && !OwnDestinations(call))
    return Refuse("in-place write to a storage another destination writes");
  if (plan.inputs.empty()) return Refuse("no tensor inputs");
  if (!call.desc->rule || !call.desc->rule->dynamic.enabled) return Refuse("not a dynamic-shape op");
  const lowering::DynamicShapes& rule = call.desc->rule->dynamic;
  if (plan.geometry_spans.size() != plan.inputs.size()) return Refuse("inputs without a geometry");
  if (DrawsAtExactShape(call)) return Refuse("draws random numbers");
  for (size_t k = 0; k < call.specs.size(); ++k) {
    const OutputSpec& s = call.specs[k];
    if (!StorageOrder(s.sizes, s.strides) && !PartialDestination(call, k))
      return Refuse("an output with gaps or overlaps");
    if (rule.integers_exact && !at::isFloatingType(s.dtype)) return Refuse("integer dtypes run exact shapes");
  }
  return true;
}

// Whether two sizes are within 2x of each other.
bool Near(int64_t a, int64_t b) { return a < 2 * b && b < 2 * a; }

// How far a call's sizes are from a variant: the sum of |log(size ratio)|
// over its static dims that differ; infinity when one differs by 2x or more
// (another family of calls: grouped-query attention's q and k, 4 and 2
// heads, share elementwise signatures and must not pad their heads).
double Distance(const SizeVariant& v, const Plan& plan) {
  double far = 0;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const auto& sizes = plan.inputs[i].geometry.sizes;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t a = sizes[d], b = v.first[i][d];
      if (a == b || v.dynamic[i][d]) continue;
      if (a <= 1 || b <= 1 || !Near(a, b)) return std::numeric_limits<double>::infinity();
      far += std::abs(std::log(static_cast<double>(a) / static_cast<double>(b)));
    }
  }
  return far;
}

// The variant of a sibling signature (same family: the op at other unit
// dims, batch 1 and batch 4) nearest to a call: over the dims above 1 in
// both, the sum of |log(size ratio)| where the sibling's dim is static or
// 2x away from the call's (the sibling's [b, s, h, d] read where this call
// is [b, h, s, d]); none when a static one differs by 2x or more. Null: none.
const SizeVariant* SiblingVariant(const SignatureState& self, const Plan& plan) {
  const SizeVariant* best = nullptr;
  double best_distance = std::numeric_limits<double>::infinity();
  for (const SignatureState* sib : *self.siblings) {
    if (sib == &self) continue;
    for (const SizeVariant& v : sib->variants) {
      if (v.first.size() != plan.inputs.size()) continue;
      double far = 0;
      for (size_t i = 0; i < plan.inputs.size() && far < best_distance; ++i) {
        const auto& sizes = plan.inputs[i].geometry.sizes;
        if (v.first[i].size() != sizes.size()) far = std::numeric_limits<double>::infinity();
        for (size_t d = 0; d < sizes.size() && far < best_distance; ++d) {
          int64_t a = sizes[d], b = v.first[i][d];
          if (a <= 1 || b <= 1 || a == b || (v.dynamic[i][d] && Near(a, b))) continue;
          far = !Near(a, b) && !v.dynamic[i][d]
                    ? std::numeric_limits<double>::infinity()
                    : far + std::abs(std::log(static_cast<double>(a) / static_cast<double>(b)));
        }
      }
      if (far < best_distance) {
        best = &v;
        best_distance = far;
      }
    }
  }
  return best;
}

// A new variant starts with the dims its nearest sibling variant made
// dynamic, where the call's size is within 2x of that variant's first: a
// batch of 4 after prompts of 33 and 34 at batch 1 runs its prompt dim
// bounded from its first call, so that a batch of 3 at a new length finds
// the bucket batch 5 compiled (Dynamo's automatic dynamic is per input, not
// per batch size, alike). A head count of 2 where a sibling's sequence of 9
// was dynamic ([b, s, h, d] and [b, h, s, d] share signatures) stays static.
// A dim that is 1 in the sibling tells nothing of itself: it turns dynamic
// where its size is one an inherited dim has, as a fresh signature's dims
// that change together turn dynamic together (an attention mask
// `[b, 1, 1, s]` whose sibling's bias was `[1, 1, 1, 1]`: else its exact
// dims meet the query's padded ones).
void InheritDynamicDims(const SizeVariant& sibling, const Plan& plan, SizeVariant* v) {
  std::set<int64_t> inherited;  // the sizes of the dims made dynamic
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const auto& sizes = plan.inputs[i].geometry.sizes;
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int64_t a = sizes[d], b = sibling.first[i][d];
      if (sibling.dynamic[i][d] && a > 1 && b > 1 && Near(a, b)) {
        v->dynamic[i][d] = true;
        inherited.insert(a);
      }
    }
  }
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const auto& sizes = plan.inputs[i].geometry.sizes;
    for (size_t d = 0; d < sizes.size(); ++d)
      if (sibling.first[i][d] == 1 && inherited.count(sizes[d])) v->dynamic[i][d] = true;
  }
}

// The variant a call belongs to: the nearest one under 2x in every dim
// that differs, else a new one (its first sizes: static, but for the dims
// its nearest sibling made dynamic when `inherit`). Past 16 variants the
// nearest (a signature called at many unrelated sizes).
SizeVariant& VariantOf(SignatureState& st, const Plan& plan, bool inherit) {
  constexpr size_t kMaxVariants = 16;
  SizeVariant* best = nullptr;
  double best_distance = std::numeric_limits<double>::infinity();
  for (auto& v : st.variants) {
    double d = Distance(v, plan);
    if (d < best_distance || (!best && st.variants.size() >= kMaxVariants)) {
      best = &v;
      best_distance = d;
    }
  }
  if (best) return *best;
  SizeVariant v;
  for (const auto& in : plan.inputs) {
    v.first.push_back(in.geometry.sizes);
    v.dynamic.emplace_back(in.geometry.sizes.size(), false);
  }
  const SizeVariant* sibling = inherit && st.siblings ? SiblingVariant(st, plan) : nullptr;
  if (sibling) InheritDynamicDims(*sibling, plan, &v);
  st.variants.push_back(std::move(v));
  return st.variants.back();
}

// Updates the signature with this call's sizes; returns the dynamic dims of
// each input (all false: run with exact shapes).
// Hinted dims: a static hint is never dynamic nor observed, a dynamic one
// (size > 1) is dynamic from the first call; in mode 0 nothing else is.
// `*static_changed`: a dim hinted static has another size than the variant's first.
std::vector<std::vector<bool>> Observe(SignatureState& st, const Plan& plan, DynamicMode mode,
                                       const CallHints& hints, bool* static_changed) {
  const size_t n = plan.inputs.size();
  SizeVariant& v = VariantOf(st, plan, mode == DynamicMode::Auto);
  std::vector<std::vector<bool>> dyn(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& sizes = plan.inputs[i].geometry.sizes;
    dyn[i].assign(sizes.size(), false);
    for (size_t d = 0; d < sizes.size(); ++d) {
      const std::optional<DimHint>& h = hints[i][d];
      if (h && !h->dynamic) {
        *static_changed |= sizes[d] != v.first[i][d];
        continue;
      }
      if (mode != DynamicMode::Off && sizes[d] > 1 &&
          (mode == DynamicMode::All || sizes[d] != v.first[i][d]))
        v.dynamic[i][d] = true;
      dyn[i][d] = (mode != DynamicMode::Off && v.dynamic[i][d]) || (h && sizes[d] > 1);
    }
  }
  return dyn;
}

// An elementwise call's inputs meet dim by dim, aligned from the right: the
// dims of a size > 1 there are one dim of the result, padded in every input
// or in none. A variant learns each input's dims apart, and one that
// inherited a sibling's (another model's call of the op) may have one side
// dynamic alone (GPT-J's rotary add after Funnel's: a batch of 4 padded to
// 16 in one input and exact in the other, which the meta kernel refuses to
// broadcast). The dims that meet a dynamic one turn dynamic too, unless one
// of them is hinted static.
void AlignElementwiseDims(const Plan& plan, const CallHints& hints, std::vector<std::vector<bool>>* dyn) {
  size_t rank = 0;
  for (const auto& in : plan.inputs) rank = std::max(rank, in.geometry.sizes.size());
  for (size_t r = 1; r <= rank; ++r) {  // the r-th dim from the right
    std::vector<std::pair<size_t, size_t>> meeting;  // (input, dim) of a size > 1 there
    bool dynamic = false, pinned = false;
    for (size_t i = 0; i < plan.inputs.size(); ++i) {
      const auto& sizes = plan.inputs[i].geometry.sizes;
      if (sizes.size() < r || sizes[sizes.size() - r] <= 1) continue;
      const size_t d = sizes.size() - r;
      meeting.emplace_back(i, d);
      dynamic |= (*dyn)[i][d];
      pinned |= hints[i][d] && !hints[i][d]->dynamic;
    }
    if (dynamic && !pinned)
      for (const auto& [i, d] : meeting) (*dyn)[i][d] = true;
  }
}

// Per input: a parameter (a leaf that requires grad, or a view of one): its
// sizes never turn dynamic (as Dynamo keeps parameters static), so two
// layers' weights of different shapes are two signatures, not one padded.
std::vector<bool> ParameterInputs(const Plan& plan, const std::vector<c10::IValue>& args) {
  std::vector<bool> fixed(plan.inputs.size(), false);
  for (size_t a = 0; a < args.size() && a < plan.args.size(); ++a) {
    const ArgPlan& ap = plan.args[a];
    if (!args[a].isTensor() || ap.kind != Arg::Kind::Tensor || ap.tensors.empty() || ap.param >= 0) continue;
    const at::Tensor& t = args[a].toTensor();
    // A view made without grad (a backward's transpose of a saved activation)
    // is a leaf of its own: its base decides.
    const at::TensorBase& root = t.is_view() ? t._base() : static_cast<const at::TensorBase&>(t);
    if (root.requires_grad() && root.is_leaf()) fixed[ap.tensors[0]] = true;
  }
  return fixed;
}

// The dims the rule counts with a static size (RuleEntry::dynamic's
// static_dims) stay static, in every input that carries them: a static dim
// broadcast against a padded one would read the padding as elements. False
// (with the rule's reason) when the call runs exact shapes. `*because`: why
// the rule keeps its dims static.
bool RuleStaticDims(const Call& call, CallHints* hints, const char** because) {
  const lowering::StaticDimsRule& rule = call.desc->rule->dynamic.static_dims;
  if (!rule) return true;
  const std::vector<Arg> abstract = AbstractArgs(call.plan);
  lowering::StaticDims dims(abstract);
  rule(abstract, dims);
  if (dims.exact()) return Refuse(dims.exact());
  *because = dims.because();
  for (const auto& [a, d] : dims.dims()) {
    if (a >= call.plan.args.size()) continue;
    const ArgPlan& ap = call.plan.args[a];
    if (ap.kind != Arg::Kind::Tensor || ap.tensors.empty() || ap.tensors[0] < 0) continue;
    auto& row = (*hints)[ap.tensors[0]];
    if (d < row.size()) row[d] = DimHint{false, -1, -1};
  }
  return true;
}

// The hints of each input's tensor (all empty when no tensor has any).
CallHints HintsOfCall(const Plan& plan, const std::vector<c10::IValue>& args, bool* any) {
  CallHints hints(plan.inputs.size());
  for (size_t i = 0; i < plan.inputs.size(); ++i) hints[i].resize(plan.inputs[i].geometry.sizes.size());
  *any = false;
  if (!g_any_hints) return hints;
  for (size_t a = 0; a < args.size() && a < plan.args.size(); ++a) {
    const ArgPlan& ap = plan.args[a];
    if (!args[a].isTensor() || ap.kind != Arg::Kind::Tensor || ap.tensors.empty() || ap.param >= 0) continue;
    const at::Tensor& t = args[a].toTensor();
    const DynamicHints* h = HintsOf(t);
    std::optional<DynamicHints> view;
    if (!h && (view = ViewHintsOf(t))) h = &*view;
    if (!h) continue;
    auto& row = hints[ap.tensors[0]];
    for (const auto& [d, hint] : h->dims)
      if (d < static_cast<int64_t>(row.size())) {
        row[d] = hint;
        *any = true;
      }
  }
  return hints;
}

bool AnyDynamic(const std::vector<bool>& v) { return std::find(v.begin(), v.end(), true) != v.end(); }

// Padding a small dim past 1.25x its size (a batch of 3 in bucket 4, or in
// a warm bucket 8) saves compiles; it is worth it only while it costs little
// memory: up to PaddingSlackBytes() more per tensor (1 MiB;
// TORCH_TPU_PADDING_SLACK_BYTES: 0 keeps every small dim within 1.2x, at a
// compile per fine bucket). Past that a small size takes a fine bucket
// (FineSmallBucket), so the activations and caches of a large model stay
// within 1.2x their exact bytes.
int64_t PaddingSlackBytes() {
  static const int64_t slack = [] {
    const char* env = std::getenv("TORCH_TPU_PADDING_SLACK_BYTES");
    return env && *env ? std::max<int64_t>(0, std::atoll(env)) : int64_t{1} << 20;
  }();
  return slack;
}

// Small buckets at most 1.2x their sizes: 1-4 exact, then every even size.
int64_t FineSmallBucket(int64_t s) { return s <= 4 ? s : (s + 1) / 2 * 2; }

// Whether a small dim of `size`, whose rows along it hold `row_bytes`, may
// run padded to `bucket`.
bool AffordablePadding(int64_t size, int64_t bucket, int64_t row_bytes) {
  return 4 * bucket <= 5 * size || (bucket - size) * row_bytes <= PaddingSlackBytes();
}

// Whether a large dim of `size` may run in a warm bucket past 1.25x its own
// (BucketOptions): at most 1.5x its size, while the padding is affordable.
bool LargeAffordable(int64_t size, int64_t bucket, int64_t row_bytes) {
  return 2 * bucket <= 3 * size && AffordablePadding(size, bucket, row_bytes);
}

// The bytes a tensor of `sizes` (elements of `item` bytes) holds per row
// along a dim of `size`.
int64_t BytesPerRow(const std::vector<int64_t>& sizes, int64_t item, int64_t size) {
  return size > 0 ? c10::multiply_integers(sizes) * item / size : 0;
}

// Per dynamic size of a call: the most bytes a row along a dim of that
// size holds in any input or result (padding that dim pads every tensor it
// is in: a linear's wide result as much as its narrow input).
std::map<int64_t, int64_t> RowBytes(const Call& call, const std::vector<std::vector<bool>>& dyn) {
  std::map<int64_t, int64_t> rows;
  auto add = [&](int64_t size, int64_t row) { rows[size] = std::max(rows[size], row); };
  for (size_t i = 0; i < call.plan.inputs.size(); ++i) {
    const std::vector<int64_t>& s = call.plan.inputs[i].geometry.sizes;
    const int64_t item = hlo::ByteSize(call.plan.inputs[i].dtype);
    for (size_t d = 0; d < s.size(); ++d)
      if (dyn[i][d]) add(s[d], BytesPerRow(s, item, s[d]));
  }
  for (const OutputSpec& spec : call.specs)  // a result's dims of a dynamic size
    for (int64_t size : spec.sizes)
      if (rows.count(size)) add(size, BytesPerRow(spec.sizes, c10::elementSize(spec.dtype), size));
  return rows;
}

// The bucket of a small size (<= kSmallBucket) of input i's dim d: the
// smallest bucket that dim has already run at which holds it, else its own.
// Small buckets are coarse (4, 8, 16: a batch of 3 pads to 4, not 16), so a
// size below a warm bucket reuses that bucket's executable instead of
// compiling its own (more padding for fewer compiles; alone, a small size
// pads under 2x). Both only while the padding is affordable; else the
// size's fine bucket.
int64_t SmallBucket(const SignatureState& st, size_t i, size_t d, int64_t size, int64_t row_bytes) {
  auto it = st.small_buckets.find({i, d});
  return SmallBucketAmong(it != st.small_buckets.end() ? it->second : std::set<int64_t>{}, size, row_bytes);
}

// The padded size of dim d of input i's buffer when the input is its whole
// padded storage with the same dims up to unit ones ([b, h] of a [b, 1, h]
// storage); -1 otherwise.
int64_t WholeBufferSize(const Plan& plan, size_t i, size_t d) {
  const TensorIn& in = plan.inputs[i];
  const runtime::DeviceStorage* s = plan.storages[in.storage];
  if (!in.geometry.whole || !s->padded() || s->real_shape.size() != s->padded_shape.size()) return -1;
  std::vector<size_t> dims;  // the storage's dims that are not 1
  for (size_t k = 0; k < s->real_shape.size(); ++k)
    if (s->real_shape[k] != 1) dims.push_back(k);
  size_t at = 0;  // view dim d is the storage's dims[at]
  for (size_t k = 0; k < in.geometry.sizes.size(); ++k) {
    if (in.geometry.sizes[k] == 1) continue;
    if (at >= dims.size() || s->real_shape[dims[at]] != in.geometry.sizes[k]) return -1;
    if (k == d) return s->padded_shape[dims[at]];
    ++at;
  }
  return -1;
}

// Per input: its sizes with dynamic dims at their bucket.
// A hinted dim's bound is its max when the size fits under it. A small
// size takes SmallBucket(), or the small bucket its input's buffer already
// has (the op that made it chose it: following it moves nothing) where that
// padding is affordable for every tensor of the call; the dims
// of one small size in a call share the largest of their choices (a
// broadcast partner or a contraction must match) unless `!share`: each dim
// keeps its own (TakeUnsharedSmallBuckets tries it on a miss).
std::vector<std::vector<int64_t>> BucketSizes(const Call& call, const std::vector<std::vector<bool>>& dyn,
                                              const CallHints& hints, const SignatureState& st,
                                              bool share = true) {
  std::vector<std::vector<int64_t>> out;
  std::map<int64_t, int64_t> small;  // small size -> its bucket in this call
  const Plan& plan = call.plan;
  const std::map<int64_t, int64_t> rows = RowBytes(call, dyn);
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    std::vector<int64_t> s = plan.inputs[i].geometry.sizes;
    for (size_t d = 0; d < s.size(); ++d) {
      if (!dyn[i][d]) continue;
      const std::optional<DimHint>& h = hints[i][d];
      if (h && h->max >= s[d]) {
        s[d] = h->max;
      } else if (s[d] <= kSmallBucket) {
        const int64_t buffer = WholeBufferSize(plan, i, d), row = rows.at(s[d]);
        const bool follow = buffer >= s[d] && buffer <= kSmallBucket && AffordablePadding(s[d], buffer, row);
        const int64_t b = follow ? buffer : SmallBucket(st, i, d, s[d], row);
        if (!share) {
          s[d] = b;
          continue;
        }
        small[s[d]] = std::max(small[s[d]], b);
        s[d] = -s[d];  // resolved below
      } else {
        s[d] = Bucket(s[d]);
      }
    }
    out.push_back(s);
  }
  for (auto& s : out)
    for (int64_t& v : s)
      if (v < 0) v = small[-v];
  return out;
}


struct DynamicLayout {
  std::vector<std::vector<bool>> in_dynamic;
  std::vector<std::vector<int64_t>> in_bucket;
  std::vector<std::vector<bool>> in_product;  // per input dim: bucketed at a product of buckets (ProductBuckets)
  std::vector<int64_t> capacity;  // per storage, -1: passed as it is
  std::vector<StorageLayout> storage_layout;  // per padded storage: its layout in the executable
  std::vector<std::optional<ViewRead>> reads;  // per input of a padded storage: its read
  std::vector<std::optional<ReshapedRead>> reshaped;  // ... or its reshaped read (rows gathered)
  std::vector<std::optional<BufferRead>> gathered;  // ... or its gather out of the buffer (OuterPaddedRead)
  // Per input read (`reads`), per layout dim: one element of an already
  // padded storage at a position > 0, taken at run time (SlidingStarts).
  std::vector<std::vector<bool>> sliding;
  // Per in-place destination written into part of its storage (`writes`),
  // per layout dim: the same for its window (a KV cache's `cache[:, t] = x`).
  std::vector<std::vector<bool>> write_sliding;
  // Per storage: read for its type only, not a module parameter: an
  // in-place destination whose old elements the op never reads
  // (RuleEntry::overwrites_destination), or a storage only empty views read.
  std::vector<bool> overwritten;
  // Per destination: its window of its storage's padded layout (nullopt: a
  // whole storage, or a fresh result).
  std::vector<std::optional<ViewRead>> writes;
  bool hinted = false;   // some input dim is dynamic by a mark_dynamic hint
  bool bounded = false;  // ... with a max
  const SignatureState* signature = nullptr;  // what the call's signature has run at (ReadBucket)
};

// A hint makes one tensor's dim dynamic; the same size in the other whole
// inputs (a broadcast partner, mm's contraction) must follow at the same
// bound, or the op's shapes disagree at the bucket. Those dims turn dynamic
// too (a coincidentally equal size is padded and masked: still exact).
void UnifyHintedSizes(const Plan& plan, const CallHints& hints, DynamicLayout* lay) {
  std::map<int64_t, int64_t> bound;  // hinted size -> its bucket
  for (size_t i = 0; i < hints.size(); ++i)
    for (size_t d = 0; d < hints[i].size(); ++d)
      if (hints[i][d] && hints[i][d]->dynamic && lay->in_dynamic[i][d])
        bound.emplace(plan.inputs[i].geometry.sizes[d], lay->in_bucket[i][d]);
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    if (!plan.inputs[i].geometry.whole) continue;
    const auto& sizes = plan.inputs[i].geometry.sizes;
    for (size_t d = 0; d < sizes.size(); ++d) {
      auto b = bound.find(sizes[d]);
      // (A dim dynamic without a hint of its own follows too: an elementwise
      // partner AlignElementwiseDims made dynamic at its own bucket.)
      if (b == bound.end() || hints[i][d]) continue;
      lay->in_dynamic[i][d] = true;
      lay->in_bucket[i][d] = b->second;
    }
  }
}

// The padded size a dynamic view dim takes whole when it is a product of
// buckets: the dims of its padded storage it merges (the h*w tokens of a
// [b, c, h, w] image read as [b, h*w, c]: their padded sizes multiplied), or
// the storage dim it reads when that dim kept such a product (the tokens'
// next readers: runtime.h DeviceStorage::product_dims); -1 otherwise.
int64_t ProductBufferSize(const Plan& plan, size_t i, size_t d) {
  const TensorIn& in = plan.inputs[i];
  const runtime::DeviceStorage& s = *plan.storages[in.storage];
  if (!s.padded()) return -1;
  const int64_t merged = MergedPaddedSize(in.geometry, d, StorageLayout{s.real_shape, s.padded_shape}, true);
  if (merged >= 0) return merged;
  int64_t stride = 1;  // storage dim k's stride among the real elements
  for (size_t k = s.real_shape.size(); k-- > 0;) {
    const bool reads_k = s.real_shape[k] == in.geometry.sizes[d] && in.geometry.strides[d] == stride;
    if (reads_k && k < s.product_dims.size() && s.product_dims[k]) return s.padded_shape[k];
    stride *= s.real_shape[k];
  }
  return -1;
}

// Dims whose sizes are products of buckets take those products as their
// buckets, so that two image sizes in one bucket share their tokens' bucket
// too (38x38 and 40x40: 1600, where Bucket(1444) = 1536 and Bucket(1600) =
// 1664); every other dynamic dim of the call with the same size follows
// (a broadcast partner, a contraction), but for the other dims of a tensor
// that has the product itself: another axis of it that happens to have the
// size (attention's bmm on [b*h, s, d] with b*h = s = 12: s keeps its own
// bucket, 16, not b*h's 32). An elementwise call's dims meet only where
// they align from the right: there the product's partners follow, and no
// other dim of its size does (an image's 25 tokens added to a [b, 25, 25]
// tensor whose 25 channels are not tokens).
void ProductBuckets(const Plan& plan, bool elementwise, DynamicLayout* lay) {
  lay->in_product.clear();
  for (const auto& b : lay->in_bucket) lay->in_product.emplace_back(b.size(), false);
  if (lay->hinted) return;
  // size -> its product bucket; elementwise: keyed by (dim from the right, size) too
  std::map<std::pair<size_t, int64_t>, int64_t> product;
  auto place = [&](size_t i, size_t d) {
    const size_t from_right = elementwise ? lay->in_dynamic[i].size() - d : 0;
    return std::make_pair(from_right, plan.inputs[i].geometry.sizes[d]);
  };
  std::set<std::pair<size_t, int64_t>> has_product;  // (input, size) of a dim that is a product
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    for (size_t d = 0; d < lay->in_dynamic[i].size(); ++d) {
      if (!lay->in_dynamic[i][d]) continue;
      const int64_t size = plan.inputs[i].geometry.sizes[d];
      const int64_t p = ProductBufferSize(plan, i, d);
      if (p < size) continue;
      product[place(i, d)] = p;
      has_product.insert({i, size});
      lay->in_product[i][d] = true;
    }
  if (product.empty()) return;
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    for (size_t d = 0; d < lay->in_dynamic[i].size(); ++d) {
      const int64_t size = plan.inputs[i].geometry.sizes[d];
      auto p = product.find(place(i, d));
      if (!lay->in_dynamic[i][d] || p == product.end()) continue;
      if (!lay->in_product[i][d] && has_product.count({i, size})) continue;  // another axis of a product's tensor
      lay->in_bucket[i][d] = p->second;
      lay->in_product[i][d] = true;
    }
}

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

StorageLayout CurrentLayout(const runtime::DeviceStorage& s, const TensorIn& in) {
  if (s.padded()) return {s.real_shape, s.padded_shape};
  return {{in.geometry.storage_numel}, {in.geometry.storage_numel}};
}

// Whether a dynamic view dim reads layout dim `j` as its bucket needs: a
// window from `start` whose bucket fits in the buffer's dim, the storage as
// it is (RoPE tables cut to the sequence length, a static cache's first s
// positions, a KV cache whose last cat padded it to a larger bucket: the
// rows past the real ones are padding the executable masks); else the whole
// dim, padded to the bucket.
bool FitsWindow(const ViewRead& r, size_t j, int64_t bucket) { return r.start[j] + bucket <= r.layout.padded[j]; }
bool PadsWhole(const ViewRead& r, size_t j, int64_t size) { return r.start[j] == 0 && r.layout.real[j] == size; }

// A dynamic view dim reading layout dim `j` but for a few elements at its
// ends (`x[:, 1:]` and `x[:, :-1]` of a diff or a label shift): the dim
// padded so that the window's bucket fits after its start, to the bucket of
// start + bucket + the elements after the window (so the windows of one start
// and end at sizes of one bucket share a layout, and diff's two windows of
// one storage agree). -1 when more than a quarter of the bucket is cut off:
// a window of a larger storage keeps exact shapes, not a copy of it.
int64_t TrimmedWindowPadding(const ViewRead& r, size_t j, int64_t size, int64_t bucket) {
  const int64_t tail = r.layout.real[j] - r.start[j] - size;
  if (tail < 0 || 4 * (r.start[j] + tail) > bucket) return -1;
  return Bucket(r.start[j] + bucket + tail);
}

// Whether storage dim j of a read of an exact storage is read at one
// element of several (`ids[:, -1]` of a batch): it takes ReadBucket().
bool ReadAtOneElement(const ViewRead& r, size_t j, bool exact_storage) {
  return exact_storage && r.view_dim[j] < 0 && r.layout.real[j] > 1;
}

// The bucket of dim j of input i's exact storage, read at one element of
// it (`ids[:, -1]`): the smallest the signature has run that dim at which
// holds it, up to 1.25x its own bucket, else its own. A batch of 3 at
// prompt 23 then reads its ids in batch 5's warm 26-bucket, not its 24.
int64_t ReadBucket(const SignatureState* st, size_t i, size_t j, int64_t size) {
  const int64_t own = Bucket(size);
  if (!st) return own;
  auto run = st->read_buckets.find({i, j});
  if (run == st->read_buckets.end()) return own;
  auto b = run->second.lower_bound(size);
  return b != run->second.end() && 4 * *b <= 5 * own ? *b : own;
}

// The layout a dynamic input needs its storage in: the dims it reads, each
// dynamic dim at its bucket (read whole, from 0) or read through a window
// that fits, the others unpadded. An exact storage's dims the view does not
// run along (one element of each: `ids[:, -1]` of a batch) are taken at
// their bucket too, the element's position at run time (SlidingStarts):
// the storage's real size (a prompt length) stays out of the key.
std::optional<StorageLayout> NeededLayout(const Plan& plan, size_t i, const std::vector<bool>& dyn,
                                          const std::vector<int64_t>& bucket, const SignatureState* st) {
  const TensorIn& in = plan.inputs[i];
  const bool exact = !plan.storages[in.storage]->padded();
  std::optional<ViewRead> read =
      MapView(in.geometry, OffsetOf(plan, in), CurrentLayout(*plan.storages[in.storage], in));
  if (!read) return std::nullopt;
  StorageLayout l = read->layout;
  for (size_t j = 0; j < l.real.size(); ++j) {
    int d = read->view_dim[j];
    bool dynamic = d >= 0 && dyn[d];
    if (ReadAtOneElement(*read, j, exact)) {
      l.padded[j] = ReadBucket(st, i, j, l.real[j]);
    } else if (!dynamic) {
      continue;  // a static window: the storage's dim as it is (an exact storage's is unpadded)
    } else if (FitsWindow(*read, j, bucket[d])) {
      continue;
    } else if (PadsWhole(*read, j, in.geometry.sizes[d])) {
      l.padded[j] = bucket[d];
    } else if (!exact) {
      continue;  // a window past a padded storage's end: read to the end, zeros after (ReadPaddedView)
    } else if (int64_t padded = TrimmedWindowPadding(*read, j, in.geometry.sizes[d], bucket[d]); padded >= 0) {
      l.padded[j] = padded;
    } else {
      return std::nullopt;
    }
  }
  return l;
}

// The reshaped read (padded_layout.h) of input `i` when a dynamic dim of its
// view reads a piece of one of its padded storage's dims; nullopt otherwise.
std::optional<ReshapedRead> ReshapedReadOf(const Plan& plan, size_t i, const std::vector<bool>& dyn) {
  const TensorIn& in = plan.inputs[i];
  const runtime::DeviceStorage& s = *plan.storages[in.storage];
  if (!s.padded()) return std::nullopt;
  const StorageLayout layout = CurrentLayout(s, in);
  bool splits = false;
  for (size_t d = 0; d < dyn.size(); ++d)
    splits |= dyn[d] && (SplitsStorageDim(in.geometry, d, layout) || MergedPaddedSize(in.geometry, d, layout, true) >= 0);
  if (!splits) return std::nullopt;
  return MapReshapedView(in.geometry, OffsetOf(plan, in), layout, dyn);
}

// The read of input `i` when its storage is padded in its first dim only,
// its one dynamic dim reads that dim whole (at a bucket the buffer holds)
// and its other dims stay inside one element of it: ViT's patch gradient,
// the `[:, 1:, :]` window of the class-token cat's gradient split into the
// patch grid, which MapView cannot split. In the buffer the view keeps its
// strides and offset (the inner dims are unpadded), at the bucket's size:
// the module gathers it (lowering::ReadView). nullopt otherwise.
std::optional<BufferRead> OuterPaddedRead(const Plan& plan, size_t i, const std::vector<bool>& dyn,
                                          const std::vector<int64_t>& bucket) {
  const TensorIn& in = plan.inputs[i];
  const runtime::DeviceStorage& s = *plan.storages[in.storage];
  const std::vector<int64_t>& real = s.real_shape;
  if (!s.padded() || real.empty() || real.size() != s.padded_shape.size()) return std::nullopt;
  for (size_t j = 1; j < real.size(); ++j)
    if (real[j] != s.padded_shape[j]) return std::nullopt;
  const int64_t row = Numel(real) / std::max<int64_t>(real[0], 1);  // elements per first-dim element
  const lowering::ViewGeometry& g = in.geometry;
  const int64_t offset = OffsetOf(plan, in);
  int64_t last = offset % std::max<int64_t>(row, 1);  // the farthest element of a row the view reads
  int dynamic_dim = -1;
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (!dyn[d]) {
      if (g.strides[d] < 0) return std::nullopt;
      last += (g.sizes[d] - 1) * g.strides[d];
      continue;
    }
    if (dynamic_dim >= 0 || g.strides[d] != row || g.sizes[d] != real[0] || bucket[d] > s.padded_shape[0])
      return std::nullopt;
    dynamic_dim = static_cast<int>(d);
  }
  if (dynamic_dim < 0 || offset >= row || last >= row) return std::nullopt;
  BufferRead r{g, offset};
  r.geometry.sizes[dynamic_dim] = bucket[dynamic_dim];
  r.geometry.storage_numel = Numel(s.padded_shape);
  r.geometry.whole = false;
  return r;
}

// The storages only empty views read (Phi-3's rotary pass-through half,
// q[..., head_dim:], cat after the rotated one): no elements, no layout to
// find, read for their type only.
void EmptyReadStorages(const Plan& plan, DynamicLayout* lay) {
  enum { kUnread, kEmptyOnly, kRead };
  std::vector<int> state(plan.storages.size(), kUnread);
  for (const TensorIn& in : plan.inputs)
    state[in.storage] = std::max(state[in.storage], Numel(in.geometry.sizes) == 0 ? int{kEmptyOnly} : int{kRead});
  for (const Dest& d : plan.dests)
    if (d.tensor.defined()) state[d.storage] = kRead;
  for (size_t s = 0; s < state.size(); ++s)
    if (state[s] == kEmptyOnly) lay->overwritten[s] = true;
}

// The destinations of a fill or copy whose storage only their own argument
// reads (x.copy_(x) reads its old elements).
void OverwrittenStorages(const Call& call, DynamicLayout* lay) {
  const Plan& plan = call.plan;
  lay->overwritten.assign(plan.storages.size(), false);
  EmptyReadStorages(plan, lay);
  if (call.desc->variant != Variant::InPlace || !call.desc->rule->overwrites_destination) return;
  std::vector<bool> mutated(plan.inputs.size(), false);
  for (size_t a : call.desc->mutable_args)
    if (a < plan.args.size())
      for (int t : plan.args[a].tensors)
        if (t >= 0) mutated[t] = true;
  for (const Dest& d : plan.dests) {
    bool only_self = true;
    for (size_t i = 0; i < plan.inputs.size(); ++i)
      only_self &= plan.inputs[i].storage != d.storage || (mutated[i] && plan.inputs[i].geometry.whole);
    lay->overwritten[d.storage] = only_self;
  }
}

// Per layout dim of read `r`: one element at a position > 0 of a padded
// layout (the storage's, or the one NeededLayout gives an exact storage),
// whose position the executable takes at run time. The last token of a
// growing sequence (`ids[:, -1:]` of a padded batch) moves with the
// sequence's real size; its executable must not. (A wider static window,
// such as RoPE's second half of a head, keeps its start: a dynamic_slice
// costs XLA:CPU more than a slice.)
std::vector<bool> SlidingStarts(const ViewRead& r) {
  std::vector<bool> sliding(r.view_dim.size(), false);
  for (size_t j = 0; j < sliding.size(); ++j) sliding[j] = r.start[j] != 0 && r.view_dim[j] < 0;
  return sliding;
}

// Remembers the buckets a call ran at (SmallBucket(), WarmerBuckets(),
// ReadBucket()).
void RememberBuckets(const Plan& plan, const DynamicLayout& lay, SignatureState* st) {
  for (size_t i = 0; i < lay.in_bucket.size(); ++i) {
    for (size_t d = 0; d < lay.in_bucket[i].size(); ++d)
      if (lay.in_dynamic[i][d])
        (lay.in_bucket[i][d] <= kSmallBucket ? st->small_buckets : st->large_buckets)[{i, d}].insert(lay.in_bucket[i][d]);
    if (!lay.reads[i]) continue;
    const ViewRead& r = *lay.reads[i];
    const bool exact = !plan.storages[plan.inputs[i].storage]->padded();
    for (size_t j = 0; j < r.view_dim.size(); ++j)
      if (ReadAtOneElement(r, j, exact)) st->read_buckets[{i, j}].insert(r.layout.padded[j]);
  }
}

// Two layouts of one storage's dims, split alike, as one whose every dim
// holds both (diff's `x[:, 1:]` needs a padded dim, `x[:, :-1]` fits the
// dim as it is); nullopt when they split the dims differently.
std::optional<StorageLayout> Wider(const StorageLayout& a, const StorageLayout& b) {
  if (a.real != b.real || a.padded.size() != b.padded.size()) return std::nullopt;
  StorageLayout w = a;
  for (size_t j = 0; j < w.padded.size(); ++j) w.padded[j] = std::max(a.padded[j], b.padded[j]);
  return w;
}

// Which storages the executable takes padded (read through a dynamic dim),
// in which layout, and how each input of such a storage reads it; false
// (exact shapes) when a view cannot be read from a padded layout.
bool PaddedStorages(const Plan& plan, DynamicLayout* lay) {
  const size_t n = plan.inputs.size();
  lay->capacity.assign(plan.storages.size(), -1);
  lay->storage_layout.assign(plan.storages.size(), {});
  lay->reads.assign(n, std::nullopt);
  lay->reshaped.assign(n, std::nullopt);
  lay->gathered.assign(n, std::nullopt);
  lay->sliding.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    if (!AnyDynamic(lay->in_dynamic[i]) || lay->overwritten[plan.inputs[i].storage]) continue;
    const size_t s = plan.inputs[i].storage;
    lay->reshaped[i] = ReshapedReadOf(plan, i, lay->in_dynamic[i]);
    std::optional<StorageLayout> l = lay->reshaped[i]
        ? CurrentLayout(*plan.storages[s], plan.inputs[i])  // read as it is
        : NeededLayout(plan, i, lay->in_dynamic[i], lay->in_bucket[i], lay->signature);
    if (!l && (lay->gathered[i] = OuterPaddedRead(plan, i, lay->in_dynamic[i], lay->in_bucket[i])))
      l = CurrentLayout(*plan.storages[s], plan.inputs[i]);  // read as it is
    if (!l) return Refuse("a dynamic input is a view no padded layout reads");
    if (Numel(l->padded) >= (int64_t{1} << 31)) return Refuse("bucket over 2^31 elements");
    if (lay->capacity[s] >= 0 && !SameLayout(lay->storage_layout[s], *l)) {
      l = Wider(lay->storage_layout[s], *l);  // each read maps onto it below
      if (!l) return Refuse("a padded storage read two ways");
    }
    lay->capacity[s] = Numel(l->padded);
    lay->storage_layout[s] = *l;
  }
  // A padded storage only static dims read is read in its layout as it is
  // (the key then holds its buckets, not its real sizes), where one maps it.
  for (size_t i = 0; i < n; ++i) {
    const size_t s = plan.inputs[i].storage;
    if (lay->capacity[s] >= 0 || lay->overwritten[s] || !plan.storages[s]->padded()) continue;
    std::optional<StorageLayout> l = NeededLayout(plan, i, lay->in_dynamic[i], lay->in_bucket[i], lay->signature);
    if (!l) continue;
    lay->capacity[s] = Numel(l->padded);
    lay->storage_layout[s] = *l;
  }
  for (size_t i = 0; i < n; ++i) {
    const TensorIn& in = plan.inputs[i];
    if (lay->gathered[i] && !SameLayout(lay->storage_layout[in.storage], CurrentLayout(*plan.storages[in.storage], in)))
      return Refuse("a padded storage read two ways");  // the gather reads the buffer as it is
    if (lay->capacity[in.storage] < 0 || lay->reshaped[i] || lay->gathered[i]) continue;
    lay->reads[i] = MapView(in.geometry, OffsetOf(plan, in), lay->storage_layout[in.storage]);
    if (!lay->reads[i]) return Refuse("a padded storage read two ways");
    const ViewRead& r = *lay->reads[i];
    lay->sliding[i] = SlidingStarts(r);
    for (size_t j = 0; j < r.view_dim.size(); ++j) {
      int d = r.view_dim[j];
      if (d < 0 || !lay->in_dynamic[i][d]) continue;  // a static window of real elements
      // A window past the buffer's end reads to the end (ReadPaddedView).
      if (r.start[j] >= r.layout.padded[j]) return Refuse("a padded storage read two ways");
    }
  }
  return true;
}

// In-place destinations that are windows of their storage: where each
// writes in the storage's padded layout (the one this call reads it in, or
// the one it keeps). False (exact shapes) when the storage is not padded or
// the window is no permutation of windows of its dims.
bool PartialWrites(const Plan& plan, DynamicLayout* lay) {
  lay->writes.assign(plan.dests.size(), std::nullopt);
  lay->write_sliding.assign(plan.dests.size(), {});
  for (size_t k = 0; k < plan.dests.size(); ++k) {
    const Dest& d = plan.dests[k];
    if (!d.tensor.defined() || d.geometry.whole) continue;
    const runtime::DeviceStorage& s = *plan.storages[d.storage];
    if (lay->capacity[d.storage] < 0 && !s.padded()) return Refuse("in-place write to part of an exact storage");
    StorageLayout layout = lay->capacity[d.storage] >= 0 ? lay->storage_layout[d.storage]
                                                         : StorageLayout{s.real_shape, s.padded_shape};
    int64_t offset = d.offset_param >= 0 ? plan.params[d.offset_param].offset : 0;
    lay->writes[k] = MapView(d.geometry, offset, layout);
    const auto& w = lay->writes[k];
    if (!w || std::find(w->broadcast.begin(), w->broadcast.end(), true) != w->broadcast.end())
      return Refuse("in-place write to part of a storage no padded layout writes");
    lay->write_sliding[k] = SlidingStarts(*w);
  }
  return true;
}

// Whether each dynamic result dim written into part of a storage covers that
// storage dim's real elements to their end (from 0, or from a start:
// BART's `shifted[:, 1:] = ids[:, :-1]`): the result's padding (at its
// bucket) then lands on the storage's padding only, cut at the buffer's end
// (WritePaddedView).
bool WritesFit(const Call& call, const DynamicLayout& lay, const std::vector<std::vector<bool>>& dyn) {
  for (size_t k = 0; k < lay.writes.size(); ++k) {
    if (!lay.writes[k]) continue;
    const ViewRead& w = *lay.writes[k];
    for (size_t j = 0; j < w.view_dim.size(); ++j) {
      const int d = w.view_dim[j];
      if (d < 0 || !dyn[k][d]) continue;
      if (w.start[j] + call.specs[k].sizes[d] != w.layout.real[j]) {
        t_short_write = {static_cast<int>(k), static_cast<size_t>(d)};
        return Refuse("in-place write to part of a storage, a dynamic dim not to its end");
      }
    }
  }
  return true;
}

// A read's part of the key: the layout's dims (the bucket where padded, a
// dynamic dim's real size left out) and the window the view reads.
void AppendReadKey(const ViewRead& r, const std::vector<bool>& dyn, const std::vector<bool>& sliding,
                   std::string* key) {
  for (size_t j = 0; j < r.view_dim.size(); ++j) {
    int d = r.view_dim[j];
    bool dynamic = d >= 0 && dyn[d];
    // A static window of a padded dim depends on the buffer's bucket only
    // (and on its start, unless the start is taken at run time).
    *key += (dynamic ? "<" : "") + std::to_string(r.layout.padded[j]) + "@" +
            (sliding[j] ? "?" : std::to_string(r.start[j])) + "v" + std::to_string(d) + ",";
  }
  for (bool expanded : r.broadcast) *key += expanded ? "B" : ".";
}

// A reshaped read's part of the key: the storage's outer padded dims and
// its rows, and the view's layout of the real elements (a dynamic dim's
// real size left out).
void AppendReshapedKey(const ReshapedRead& r, const std::vector<bool>& dyn, std::string* key) {
  *key += "X";
  for (int64_t d : r.outer_padded) *key += std::to_string(d) + ",";
  *key += "r" + std::to_string(r.row) + ":";
  const ViewRead& v = r.view;
  for (size_t j = 0; j < v.view_dim.size(); ++j) {
    const int d = v.view_dim[j];
    *key += (d >= 0 && dyn[d] ? "<" : std::to_string(v.layout.real[j])) + "@" + std::to_string(v.start[j]) + "v" +
            std::to_string(d) + ",";
  }
  for (bool expanded : v.broadcast) *key += expanded ? "B" : ".";
}

// An input's sizes in the executable, the dynamic ones marked.
void AppendBucketKey(const std::vector<int64_t>& bucket, const std::vector<bool>& dyn, std::string* key) {
  for (size_t d = 0; d < bucket.size(); ++d) *key += (dyn[d] ? "<" : "") + std::to_string(bucket[d]) + ",";
}

// A partial write's part of the key: the layout's padded dims and the
// window (WritesFit checks the real sizes per call).
void AppendWriteKey(const ViewRead& w, const std::vector<bool>& sliding, std::string* key) {
  *key += "W";
  for (size_t j = 0; j < w.view_dim.size(); ++j)
    *key += std::to_string(w.layout.padded[j]) + "@" + (sliding[j] ? "?" : std::to_string(w.start[j])) + "v" +
            std::to_string(w.view_dim[j]) + ",";
}

std::string DynamicKey(const std::string& sig, const Plan& plan, const DynamicLayout& lay) {
  std::string key = "dyn|" + sig + "|";
  for (size_t k = 0; k < lay.writes.size(); ++k)
    if (lay.writes[k]) AppendWriteKey(*lay.writes[k], lay.write_sliding[k], &key);
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    if (lay.overwritten[plan.inputs[i].storage]) {  // read for its type only
      AppendBucketKey(lay.in_bucket[i], lay.in_dynamic[i], &key);
      key += "/o";
    } else if (lay.reads[i]) {
      AppendBucketKey(lay.in_bucket[i], lay.in_dynamic[i], &key);
      key += "/";
      AppendReadKey(*lay.reads[i], lay.in_dynamic[i], lay.sliding[i], &key);
    } else if (lay.reshaped[i]) {
      AppendBucketKey(lay.in_bucket[i], lay.in_dynamic[i], &key);
      key += "/";
      AppendReshapedKey(*lay.reshaped[i], lay.in_dynamic[i], &key);
    } else if (lay.gathered[i]) {
      AppendBucketKey(lay.in_bucket[i], lay.in_dynamic[i], &key);
      key += "/G" + std::to_string(lay.gathered[i]->offset) + ":";
      lay.gathered[i]->geometry.AppendKey(&key);
    } else {
      plan.inputs[i].geometry.AppendKey(&key);
      AppendCapacityKey(*plan.storages[plan.inputs[i].storage], &key);
    }
    // The module takes a view's offset as a parameter: a front window and
    // the whole tensor key alike (Signature) but differ in it (attention's
    // logsumexp cut to 36 of its 64 rows, or whole at 32).
    if (plan.inputs[i].offset_param >= 0) key += "+o";
    key += ";";
  }
  return key;
}

// One of the rule's size ints (lowering::SizeInt) the call keyed without its
// value, at some sizes.
struct SizeIntValue {
  size_t arg;
  int64_t element;  // an int list's element; -1: an int arg
  int64_t value;
};

// The call's size ints at the inputs' `sizes`.
std::vector<SizeIntValue> SizeIntsAt(const Call& call, const std::vector<std::vector<int64_t>>& sizes) {
  std::vector<SizeIntValue> at;
  const Plan& plan = call.plan;
  for (const lowering::SizeInt& s : call.desc->rule->dynamic.size_ints) {
    if (s.arg >= plan.args.size() || s.tensor_arg >= plan.args.size()) continue;
    const ArgPlan& t = plan.args[s.tensor_arg];
    const Arg& a = plan.args[s.arg].literal;
    if (t.kind != Arg::Kind::Tensor || t.tensors.empty() || t.tensors[0] < 0 || t.param >= 0) continue;
    double scale = 1.0;
    if (s.scale_arg >= 0) {
      if (static_cast<size_t>(s.scale_arg) >= plan.args.size() || plan.args[s.scale_arg].kind != Arg::Kind::Double) continue;
      scale = plan.args[s.scale_arg].literal.d;
    }
    const int64_t real = s.Of(plan.inputs[t.tensors[0]].geometry.sizes, scale);
    const bool keyed_without = s.element < 0 ? plan.args[s.arg].kind == Arg::Kind::Int && a.i == real
                                             : plan.args[s.arg].kind == Arg::Kind::IntList &&
                                                   static_cast<size_t>(s.element) < a.ints.size() &&
                                                   a.ints[s.element] == real;
    if (keyed_without) at.push_back({s.arg, s.element, s.Of(sizes.at(t.tensors[0]), scale)});
  }
  return at;
}

// Schema arg `a` with the call's size ints set to their values in `at`.
void SetSizeInts(const std::vector<SizeIntValue>& at, std::vector<ArgPlan>* args) {
  for (const SizeIntValue& v : at) {
    Arg& a = (*args)[v.arg].literal;
    if (v.element < 0) a.i = v.value;
    else a.ints[v.element] = v.value;
  }
}

// The IValue of schema arg i with the size ints in `at` set (the meta kernel's argument).
c10::IValue WithSizeInts(const std::vector<SizeIntValue>& at, size_t i, const c10::IValue& v) {
  std::optional<std::vector<int64_t>> ints;
  for (const SizeIntValue& s : at) {
    if (s.arg != i) continue;
    if (s.element < 0) return s.value;
    if (!ints) ints = v.toIntVector();
    (*ints)[s.element] = s.value;
  }
  return ints ? c10::IValue(*ints) : v;
}

// Dense strides for `sizes` in the order of g's dims in memory (outermost:
// largest stride first); a broadcast dim (stride 0) stays one.
std::vector<int64_t> StridesInOrder(const lowering::ViewGeometry& g, const std::vector<int64_t>& sizes) {
  std::vector<int64_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<bool> broadcast(sizes.size(), false);
  if (g.strides.size() == sizes.size()) {
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return g.strides[a] > g.strides[b]; });
    for (size_t d = 0; d < sizes.size(); ++d) broadcast[d] = g.strides[d] == 0 && g.sizes[d] > 1;
  }
  return DenseStrides(sizes, order, broadcast);
}

}  // namespace

std::vector<OutputSpec> MetaSpecsAt(const Call& call, const c10::OperatorHandle& op,
                                    const std::vector<c10::IValue>& args,
                                    const std::vector<std::vector<int64_t>>& sizes) {
  const std::vector<SizeIntValue> size_ints = SizeIntsAt(call, sizes);
  const int64_t like = call.desc->rule->dynamic.result_like_arg;
  if (like >= 0 && call.specs.size() == 1 && static_cast<size_t>(like) < call.plan.args.size() &&
      !call.plan.args[like].tensors.empty() && call.plan.args[like].tensors[0] >= 0) {
    const std::vector<int64_t>& s = sizes.at(call.plan.args[like].tensors[0]);
    return {{s, lowering::ContiguousStrides(s), call.specs[0].dtype}};
  }
  if (call.desc->rule->output_types) {  // as the call's own specs came
    Call at_sizes = call;
    for (size_t i = 0; i < sizes.size(); ++i) at_sizes.plan.inputs[i].geometry.sizes = sizes[i];
    SetSizeInts(size_ints, &at_sizes.plan.args);
    return RuleOutputSpecs(at_sizes);
  }
  // Plan input `input`'s tensor `t` as a meta tensor at `sizes`, laid out in
  // its dims' order (the outputs of an op on a permuted view follow it).
  auto meta = [&](const at::Tensor& t, int input) {
    const std::vector<int64_t>& at_sizes = sizes.at(input);
    return at::empty_strided(at_sizes, StridesInOrder(call.plan.inputs.at(input).geometry, at_sizes),
                             t.options().device(at::kMeta));
  };
  torch::jit::Stack stack;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    const ArgPlan& ap = call.plan.args[i];
    if (v.isTensor() && ap.kind == Arg::Kind::Tensor && !ap.tensors.empty() && ap.param < 0) {
      stack.push_back(meta(v.toTensor(), ap.tensors[0]));
    } else if (v.isTensorList() && ap.kind == Arg::Kind::TensorList) {
      std::vector<at::Tensor> metas;
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) metas.push_back(meta(list[j], ap.tensors.at(j)));
      stack.push_back(metas);
    } else if (v.isList() && ap.kind == Arg::Kind::TensorList) {  // Tensor?[] (index's indices)
      c10::List<std::optional<at::Tensor>> metas;
      auto list = v.toListRef();
      for (size_t j = 0; j < list.size(); ++j)
        // None comes boxed as None or as an undefined tensor (`x[:, i]`'s first index)
        metas.push_back(list[j].isNone() || !list[j].toTensor().defined()
                            ? std::nullopt
                            : std::optional<at::Tensor>(meta(list[j].toTensor(), ap.tensors.at(j))));
      stack.push_back(metas);
    } else if (v.isDevice()) {
      stack.push_back(c10::Device(at::kMeta));
    } else {
      stack.push_back(WithSizeInts(size_ints, i, v));
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(stack);
  }
  std::vector<OutputSpec> out;
  for (const auto& r : stack) {
    if (r.isNone() || (r.isTensor() && !r.toTensor().defined())) continue;  // undefined: as call.specs
    if (!r.isTensor()) throw lowering::Unsupported("dynamic: a non-tensor result");
    const at::Tensor& t = r.toTensor();
    out.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
  }
  return out;
}

namespace {

// An input at its bucket's sizes (read out of its padded storage buffer,
// padded_layout.h: the real elements at the front of each padded dim) with
// the runtime size of each dynamic dim (`runtime`, per dim).
Value Sized(hlo::Builder& b, Value v, const std::vector<bool>& dyn, const std::vector<Value>& runtime) {
  for (size_t d = 0; d < dyn.size(); ++d)
    if (dyn[d]) v = b.SetDimensionSize(v, runtime[d], static_cast<int64_t>(d));
  return v;
}

// A dynamic result as its storage keeps it: static at the bucket's sizes
// (the real elements at the front of each dim, as read above), flat. XLA:CPU
// returns a dynamic result with its sizes appended to the buffer, which no
// executable then takes as a parameter (nor can one declare a dynamic
// parameter: PadToStatic is missing there); gathering a dynamic dim's
// indices 0..bound-1 one at a time makes it static without moving the real
// elements (XLA's dynamic-dimension inference drops a dim gathered with
// slice size 1).
// `order`: the result's dims in storage order (a permuted result, e.g. an
// elementwise op on a transposed view, keeps its input's memory order).
// `buffer`: the sizes the storage keeps (each dynamic dim at the bucket of
// its bound: a cat's bound, its inputs' buckets summed, is no bucket; the
// next op reads the result at its bucket).
// `v` static: each dynamic dim d gathered at indices 0..sizes[d]-1 (rows
// past its bound repeat its last one: a gather clamps; padding).
Value GatheredStatic(hlo::Builder& b, Value v, const std::vector<bool>& dyn, const std::vector<int64_t>& sizes) {
  for (size_t d = 0; d < dyn.size(); ++d) {
    if (!dyn[d]) continue;
    Value rows = b.Iota(hlo::TensorType{ElementType::I32, {sizes[d], 1}}, 0);
    Value g = b.Gather(v, rows, {static_cast<int64_t>(d)});  // dim d first
    std::vector<int64_t> perm;
    for (size_t i = 0; i < dyn.size(); ++i)
      perm.push_back(i < d ? static_cast<int64_t>(i) + 1 : (i == d ? 0 : static_cast<int64_t>(i)));
    v = b.Transpose(g, perm);
  }
  return v;
}

Value PadDynamic(hlo::Builder& b, Value v, std::vector<bool> dyn, const std::vector<int64_t>& order,
                 std::vector<int64_t> buffer) {
  bool permuted = false;
  for (size_t d = 0; d < order.size(); ++d) permuted |= order[d] != static_cast<int64_t>(d);
  if (permuted) {
    v = b.Transpose(v, order);
    std::vector<bool> moved;
    std::vector<int64_t> sizes;
    for (int64_t d : order) {
      moved.push_back(dyn[d]);
      sizes.push_back(buffer[d]);
    }
    dyn = moved;
    buffer = sizes;
  }
  v = GatheredStatic(b, v, dyn, buffer);
  return b.Reshape(v, {v.type.numel()});
}

// Whether the module runs on the buckets' static arrays with no runtime
// sizes set: an elementwise rule, or one whose results are independent
// along every dim this call has dynamic (RuleEntry::dynamic.independent_dims:
// a linear at a new batch size); the padding's results are never read.
bool Unmasked(const Call& call, const DynamicLayout& lay) {
  const lowering::DynamicShapes& rule = call.desc->rule->dynamic;
  if (rule.draws_at_real_sizes && DrawsRandomBits(call)) return false;  // its draws need the real sizes
  if (rule.elementwise) return true;
  if (!rule.independent_dims) return false;
  const Plan& plan = call.plan;
  const std::vector<Arg> abstract = AbstractArgs(plan);
  lowering::StaticDims dims(abstract);
  rule.independent_dims(abstract, dims);
  std::vector<int> input_of;  // per rule arg (AbstractArgs leaves out= args out): its input, -1 none
  for (size_t a = 0; a < plan.args.size(); ++a) {
    if (a < plan.is_out.size() && plan.is_out[a]) continue;
    const ArgPlan& ap = plan.args[a];
    const bool tensor = ap.kind == Arg::Kind::Tensor && !ap.tensors.empty() && ap.param < 0;
    input_of.push_back(tensor ? ap.tensors[0] : -1);
  }
  std::set<std::pair<size_t, size_t>> independent;  // (input, dim)
  for (const auto& [arg, d] : dims.dims())
    if (arg < input_of.size() && input_of[arg] >= 0) independent.insert({static_cast<size_t>(input_of[arg]), d});
  for (size_t i = 0; i < lay.in_dynamic.size(); ++i)
    for (size_t d = 0; d < lay.in_dynamic[i].size(); ++d)
      if (lay.in_dynamic[i][d] && !independent.count({i, d})) return false;
  return true;
}

// Each input the module reads out of its storage, at its buckets' sizes
// (padded_layout.h: a window of the padded buffer, or rows gathered for a
// reshaped read; an overwritten destination only for its type). `masked`:
// each dynamic dim at its runtime size (`sizes`, in input order).
std::vector<Value> ReadInputs(hlo::Builder& b, const Plan& plan, const DynamicLayout& lay,
                              const std::vector<Value>& params, const std::vector<Value>& sizes,
                              const std::vector<std::vector<Value>>& outer_real,
                              const std::vector<std::vector<Value>>& starts, bool masked) {
  size_t next = 0;
  std::vector<Value> reads(plan.inputs.size());
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const TensorIn& in = plan.inputs[i];
    const std::vector<bool>& dyn = lay.in_dynamic[i];
    std::vector<Value> runtime(dyn.size());  // the dynamic dims' runtime sizes
    for (size_t d = 0; d < dyn.size(); ++d)
      if (dyn[d]) runtime[d] = sizes[next++];
    Value v;
    if (lay.overwritten[in.storage])  // the rule reads its type only
      v = b.Splat(in.dtype, 0, lay.in_bucket[i]);
    else if (lay.reads[i])
      v = ReadPaddedView(b, params[in.storage_param], *lay.reads[i], lay.in_bucket[i], starts[i]);
    else if (lay.reshaped[i])
      v = ReadReshapedView(b, params[in.storage_param], *lay.reshaped[i], lay.in_bucket[i], runtime, outer_real[i]);
    else if (lay.gathered[i])
      v = lowering::ReadView(b, params[in.storage_param], b.ConstantInt(ElementType::I64, lay.gathered[i]->offset),
                             lay.gathered[i]->geometry);
    else
      continue;
    reads[i] = masked ? Sized(b, v, dyn, runtime) : v;
  }
  return reads;
}

// The padded size of a result's dynamic dim d whose size in the executable
// is `big`: its bucket (a hint's max is the bucket itself), or `big` when
// that is a small size whose coarse bucket would cost more memory than it
// may (AffordablePadding: a fine small bucket stays fine).
int64_t ResultBucket(const OutputSpec& spec, size_t d, int64_t big) {
  const int64_t size = spec.sizes[d];
  if (big > kSmallBucket || size <= 0) return Bucket(big);
  const int64_t row = BytesPerRow(spec.sizes, c10::elementSize(spec.dtype), size);
  return AffordablePadding(size, Bucket(big), row) ? Bucket(big) : big;
}

// Whether each result at its bucket is as large as the buffer its storage keeps.
bool ResultsFillTheirBuffers(const DynamicCompiled& dc) {
  for (size_t k = 0; k < dc.out_bucket.size() && k < dc.out_buffer.size(); ++k)
    if (Numel(dc.out_bucket[k]) != Numel(dc.out_buffer[k])) return false;
  return true;
}

std::string BuildDynamicModule(const Call& call, const DynamicLayout& lay,
                               const std::vector<OutputSpec>& bucket_specs,
                               DynamicCompiled& dc) {
  const Plan& plan = call.plan;
  hlo::Builder b("dyn_op");
  std::vector<Value> params;
  for (const auto& q : plan.params) {
    // Dynamic modules read storages their own way; an overwritten one not at all.
    if (q.buffer_read || (q.kind == Param::Kind::Storage && lay.overwritten[q.storage])) {
      params.emplace_back();
      continue;
    }
    TensorType t = ParamType(plan, q);
    if (q.kind == Param::Kind::Storage && lay.capacity[q.storage] >= 0)
      t.shape = {lay.capacity[q.storage]};
    params.push_back(b.Parameter(t));
  }
  std::vector<Value> sizes;
  for (const auto& dyn : lay.in_dynamic)
    for (bool d : dyn)
      if (d) sizes.push_back(b.Parameter({ElementType::I32, {}}));
  std::vector<std::vector<Value>> outer_real(plan.inputs.size());  // reshaped reads' storage sizes
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    if (lay.reshaped[i])
      for (size_t m = 0; m < lay.reshaped[i]->outer_padded.size(); ++m)
        outer_real[i].push_back(b.Parameter({ElementType::I32, {}}));
  std::vector<std::vector<Value>> starts(plan.inputs.size());  // sliding windows' starts
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    for (bool sliding : lay.sliding[i])
      starts[i].push_back(sliding ? b.Parameter({ElementType::I32, {}}) : Value{});
  std::vector<std::vector<Value>> write_starts(lay.writes.size());  // ... and of its writes
  for (size_t k = 0; k < lay.writes.size(); ++k)
    for (bool sliding : lay.write_sliding[k])
      write_starts[k].push_back(sliding ? b.Parameter({ElementType::I32, {}}) : Value{});
  // An elementwise or row-independent call runs on the buckets' static arrays: no sizes set
  // (unless a result's buffer is larger than its bucket: a small size that followed its
  // input's buffer, 10, into a result kept at Bucket(10) = 16, is padded as a masked one).
  const bool masked = !Unmasked(call, lay) || !ResultsFillTheirBuffers(dc);
  std::vector<Value> reads = ReadInputs(b, plan, lay, params, sizes, outer_real, starts, masked);
  Call bucket_call = call;
  bucket_call.specs = bucket_specs;
  SetSizeInts(SizeIntsAt(call, lay.in_bucket), &bucket_call.plan.args);
  for (auto& in : bucket_call.plan.inputs) in.buffer_geometry.reset();  // storages may be re-laid out
  // In-place destinations take the result as their new buffer: fresh values.
  for (auto& d : bucket_call.plan.dests) {
    d.tensor = at::Tensor();
    d.fresh = true;
  }
  bucket_call.written.clear();
  Emitted e = EmitCall(bucket_call, b, params, &reads);
  if (!e.written_values.empty()) throw lowering::Unsupported("dynamic: op with writes");
  // Assertions are reductions over the inputs (index bounds): the padder
  // masks their padding like any other reduction.
  if (!masked && !e.checks.empty()) throw lowering::Unsupported("dynamic: an unmasked module's checks would read padding");
  std::vector<Value> outs;
  for (const auto& check : e.checks) {
    outs.push_back(check.ok);
    dc.checks.push_back(CheckMessage(*call.desc, check.message));
  }
  for (size_t k = 0; k < e.fresh_results.size(); ++k) {
    Value result = e.fresh_results[k];
    // Static already: the dims to gather, none (its sizes must be the buffer's).
    std::vector<bool> dyn = masked ? dc.out_dynamic[k] : std::vector<bool>(result.shape().size(), false);
    if (!masked && result.type.numel() != Numel(dc.out_buffer[k]))
      throw lowering::Unsupported("dynamic: an unmasked result off its buckets");
    if (k < lay.writes.size() && lay.writes[k]) {  // into part of its storage's padded buffer
      Value update = GatheredStatic(b, result, dyn, dc.out_bucket[k]);
      Value buffer = params.at(plan.storage_param.at(plan.dests[k].storage));
      outs.push_back(WritePaddedView(b, buffer, *lay.writes[k], update, write_starts[k]));
    } else {
      outs.push_back(PadDynamic(b, result, dyn, dc.out_order[k], dc.out_buffer[k]));
    }
  }
  b.Return(outs);
  return b.ToText();
}

// Whether an executable's static result dims (`dyn` false) are this call's
// sizes: a dim rounded up from a dynamic one (a logsumexp's rows, to a
// multiple of 32) is the same at the bucket as at the real size only when
// both round alike (sizes past 512, in buckets of 64, may not).
bool StaticResultsFit(const std::vector<std::vector<bool>>& dyn, const std::vector<std::vector<int64_t>>& bucket,
                      const Call& call) {
  for (size_t k = 0; k < dyn.size(); ++k)
    for (size_t d = 0; d < dyn[k].size(); ++d)
      if (!dyn[k][d] && bucket[k][d] != call.specs[k].sizes[d])
        return Refuse("a static result dim rounded past its real size at the bucket");
  return true;
}

// Whether executable `dc` serves this call laid out as `lay`: its static
// result dims are the call's, and its writes into part of a storage cover
// their real elements to the end.
bool ExecutableFits(const DynamicCompiled& dc, const Call& call, const DynamicLayout& lay) {
  return StaticResultsFit(dc.out_dynamic, dc.out_bucket, call) && WritesFit(call, lay, dc.out_dynamic);
}

// Output specs with each dynamic dim at half its bucket (a stepped rule's
// results, RuleEntry::dynamic.stepped_outputs); none when the op refuses
// those sizes (a kernel larger than half the bucket).
std::vector<OutputSpec> HalfBucketSpecs(const Call& call, const c10::OperatorHandle& op,
                                        const std::vector<c10::IValue>& args, const DynamicLayout& lay) {
  std::vector<std::vector<int64_t>> half = lay.in_bucket;
  for (size_t i = 0; i < half.size(); ++i)
    for (size_t d = 0; d < half[i].size(); ++d)
      if (lay.in_dynamic[i][d]) half[i][d] = (half[i][d] + 1) / 2;
  try {
    return MetaSpecsAt(call, op, args, half);
  } catch (const std::exception&) {
    return {};
  }
}

// Compiles the executable of `key` (nullptr: the signature stays exact; the
// call alone runs exact when its static result dims do not fit: `*unfit`).
DynamicCompiled* CompileDynamic(const std::string& key, const Call& call, const c10::OperatorHandle& op,
                                const std::vector<c10::IValue>& args, const DynamicLayout& lay, bool* unfit) {
  // Output dims that follow the dynamic input dims: those that change when
  // the bucket sizes shrink by one.
  std::vector<std::vector<int64_t>> smaller = lay.in_bucket;
  for (size_t i = 0; i < smaller.size(); ++i)
    for (size_t d = 0; d < smaller[i].size(); ++d)
      if (lay.in_dynamic[i][d]) --smaller[i][d];
  std::vector<OutputSpec> bucket_specs = MetaSpecsAt(call, op, args, lay.in_bucket);
  std::vector<OutputSpec> smaller_specs = MetaSpecsAt(call, op, args, smaller);
  const std::vector<OutputSpec> half_specs = call.desc->rule->dynamic.stepped_outputs
      ? HalfBucketSpecs(call, op, args, lay) : std::vector<OutputSpec>{};
  // The tensors the op writes beside its results (RuleEntry::extra_mutated_args:
  // batch norm's running statistics) keep their sizes.
  if (bucket_specs.size() + call.desc->rule->extra_mutated_args.size() == call.specs.size())
    for (size_t k = bucket_specs.size(); k < call.specs.size(); ++k) {
      bucket_specs.push_back(call.specs[k]);
      smaller_specs.push_back(call.specs[k]);
    }
  if (bucket_specs.size() != call.specs.size()) return nullptr;
  DynamicCompiled dc;
  std::set<int64_t> products;  // the product buckets of the inputs' dims
  for (size_t i = 0; i < lay.in_product.size(); ++i)
    for (size_t d = 0; d < lay.in_product[i].size(); ++d)
      if (lay.in_product[i][d]) products.insert(lay.in_bucket[i][d]);
  for (size_t k = 0; k < bucket_specs.size(); ++k) {
    const auto& big = bucket_specs[k].sizes;
    if (smaller_specs[k].sizes.size() != big.size() || big.size() != call.specs[k].sizes.size())
      return nullptr;
    std::vector<bool> dyn(big.size());
    for (size_t d = 0; d < big.size(); ++d) {
      dyn[d] = big[d] != smaller_specs[k].sizes[d];
      if (k < half_specs.size() && half_specs[k].sizes.size() == big.size()) dyn[d] = dyn[d] || big[d] != half_specs[k].sizes[d];
    }
    dc.out_dynamic.push_back(dyn);
    dc.out_bucket.push_back(big);
    // A partial write's strides are its window's (gaps): its order is unused.
    std::optional<std::vector<int64_t>> order = StorageOrder(call.specs[k].sizes, call.specs[k].strides);
    if (!order) {
      order.emplace(big.size());
      std::iota(order->begin(), order->end(), 0);
    }
    dc.out_order.push_back(*order);
    std::vector<int64_t> buffer = big;
    std::vector<bool> product(big.size(), false);  // a product bucket's dim keeps it (ProductBuckets)
    for (size_t d = 0; d < big.size(); ++d) {
      product[d] = dyn[d] && products.count(big[d]);
      if (dyn[d] && !lay.bounded && !product[d]) buffer[d] = ResultBucket(call.specs[k], d, big[d]);
    }
    dc.out_buffer.push_back(buffer);
    dc.out_product.push_back(product);
  }
  if (!ExecutableFits(dc, call, lay)) {
    *unfit = true;
    return nullptr;
  }
  std::string text = BuildDynamicModule(call, lay, bucket_specs, dc);
  dc.exe = GetOrCompileCounted(key, call.plan.device, [&] { return text; }, call.desc->name, true);
  CountDynamicExecutable();
  return &(State().executables[key] = std::move(dc));
}

// A padded storage's parameter: its buffer when it already holds `layout`
// (a dynamic op's result, or an exact buffer whose sizes sit at their
// bucket). Otherwise (the first dynamic op of a chain) the storage is padded
// first, through the host: an exact buffer's type changes with every size,
// so a device-side pad would compile per size. The storage stays padded for
// its next readers.
pjrt::BufferPtr PaddedStorageBuffer(runtime::DeviceStorage* s, const StorageLayout& layout, int device) {
  bool fits = s->padded() ? SameLayout({s->real_shape, s->padded_shape}, layout) : layout.real == layout.padded;
  if (!fits) {
    auto opts = at::TensorOptions().dtype(ToScalarType(s->dtype));
    at::Tensor value = at::empty(layout.real, opts);
    DownloadStorage(*s, value.data_ptr());
    at::Tensor padded = at::zeros(layout.padded, opts);
    at::Tensor front = padded;
    for (size_t d = 0; d < layout.real.size(); ++d)
      front = front.narrow(static_cast<int64_t>(d), 0, layout.real[d]);
    front.copy_(value);
    s->SetPadded(GetRuntime().Upload(padded.data_ptr(), s->dtype, {padded.numel()}, device), layout.real,
                 layout.padded);
  } else if (!s->padded()) {
    // Sizes at their bucket: the buffer as it is, laid out as the padded
    // ones of other sizes are, so that its next readers key it alike.
    s->SetPadded(s->buffer, layout.real, layout.padded);
  }
  return s->buffer;
}

runtime::LaunchParam PaddedParam(runtime::DeviceStorage* s, const StorageLayout& layout, int device) {
  return runtime::LaunchParam::Of(PaddedStorageBuffer(s, layout, device));
}

// The results of a call a hint made dynamic carry it on the dims that follow
// the dynamic inputs (bounded at their bucket when the hint had a max).
void PropagateHints(const at::Tensor& t, const std::vector<bool>& dyn, const std::vector<int64_t>& bucket,
                    bool bounded) {
  for (size_t d = 0; d < dyn.size(); ++d) {
    if (!dyn[d]) continue;
    DynamicHints& h = MutableHints(t);
    if (h.dims.count(static_cast<int64_t>(d))) continue;
    h.dims[static_cast<int64_t>(d)] = DimHint{true, -1, bounded ? bucket[d] : -1};
  }
}

// A storage written in part takes the new buffer in the padded layout it
// was passed in (its own when it read it so).
void KeepWrittenLayout(runtime::DeviceStorage* s, pjrt::BufferPtr buffer, const DynamicLayout& lay, size_t storage) {
  StorageLayout layout{s->real_shape, s->padded_shape};
  if (lay.capacity[storage] >= 0 && !(s->padded() && SameLayout(layout, lay.storage_layout[storage])))
    layout = lay.storage_layout[storage];
  s->SetPadded(std::move(buffer), layout.real, layout.padded);
}

// The runtime sizes (i32 parameters) of a dynamic call: its inputs' dynamic
// dims, the real sizes outside the rows of its reshaped reads, then the
// starts of its sliding windows, read then written.
std::vector<int64_t> RuntimeSizes(const Plan& plan, const DynamicLayout& lay) {
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    for (size_t d = 0; d < lay.in_dynamic[i].size(); ++d)
      if (lay.in_dynamic[i][d]) sizes.push_back(plan.inputs[i].geometry.sizes[d]);
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    if (lay.reshaped[i])
      for (size_t m = 0; m < lay.reshaped[i]->outer_padded.size(); ++m)
        sizes.push_back(plan.storages[plan.inputs[i].storage]->real_shape[m]);
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    for (size_t j = 0; j < lay.sliding[i].size(); ++j)
      if (lay.sliding[i][j]) sizes.push_back(lay.reads[i]->start[j]);
  for (size_t k = 0; k < lay.writes.size(); ++k)
    for (size_t j = 0; j < lay.write_sliding[k].size(); ++j)
      if (lay.write_sliding[k][j]) sizes.push_back(lay.writes[k]->start[j]);
  return sizes;
}

// The layout result k of a dynamic call keeps: padded (storage order) when
// it has a dynamic dim.
ResultLayout ResultLayoutOf(const Call& call, const DynamicCompiled& dc, size_t k) {
  ResultLayout r;
  if (!AnyDynamic(dc.out_dynamic[k])) return r;
  for (int64_t d : dc.out_order[k]) {
    r.real.push_back(call.specs[k].sizes[d]);
    r.padded.push_back(dc.out_buffer[k][d]);
    r.product.push_back(dc.out_product[k][d]);
  }
  if (std::find(r.product.begin(), r.product.end(), true) == r.product.end()) r.product.clear();
  return r;
}

std::vector<c10::IValue> LaunchDynamic(const Call& call, const DynamicCompiled& dc, const DynamicLayout& lay,
                                       FastCall& fast) {
  const Plan& plan = call.plan;
  auto& rt = GetRuntime();
  runtime::Launch launch;
  launch.exe = dc.exe.get();
  launch.device = plan.device;
  launch.op = &call.desc->name;
  launch.checks = &dc.checks;
  BoundedLaunch again{dc.exe, dc.checks, std::vector<bool>(plan.params.size(), false), RuntimeSizes(plan, lay), {}};
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const Param& q = plan.params[p];
    // Not parameters of dynamic modules.
    if (q.buffer_read || (q.kind == Param::Kind::Storage && lay.overwritten[q.storage])) continue;
    again.taken[p] = true;
    if (q.kind == Param::Kind::Storage && lay.capacity[q.storage] >= 0)
      launch.params.push_back(PaddedParam(plan.storages[q.storage], lay.storage_layout[q.storage], plan.device));
    else
      launch.params.push_back(LaunchValue(plan, q));
  }
  for (int64_t size : again.sizes) launch.params.push_back(runtime::LaunchParam::Integer(size, ElementType::I32));
  std::vector<pjrt::BufferPtr> outs = runtime::Run(rt, launch);
  std::vector<c10::IValue> results;
  for (size_t k = 0; k < call.specs.size(); ++k) {
    const at::Tensor& dest = plan.dests[k].tensor;  // in-place: its storage takes the result
    at::Tensor t = dest.defined() ? dest : FreshTensor(call, k);
    runtime::DeviceStorage* s = StorageOf(t);
    if (k < lay.writes.size() && lay.writes[k]) {
      KeepWrittenLayout(s, outs.at(k), lay, plan.dests[k].storage);
    } else {
      again.results.push_back(ResultLayoutOf(call, dc, k));
      again.results.back().Apply(s, outs.at(k));
    }
    if (lay.hinted) PropagateHints(t, dc.out_dynamic[k], dc.out_bucket[k], lay.bounded);
    results.push_back(t);
  }
  CountNative(*call.desc);
  if (!lay.hinted) fast.RememberBounded(call, std::move(again));
  return WithUndefined(call, std::move(results));
}

// Which storages a dynamic call takes padded, in which layouts, and where
// it writes windows of them; false (with the reason) when it runs exact.
bool LayOutStorages(const Call& call, DynamicLayout* lay) {
  OverwrittenStorages(call, lay);
  if (!PaddedStorages(call.plan, lay)) {
    // A window of an exact storage (x[1:].add_(1)): the write is the reason.
    for (size_t k = 0; k < call.specs.size(); ++k)
      if (PartialDestination(call, k)) Refuse("in-place write to part of a storage");
    return false;
  }
  return PartialWrites(call.plan, lay);
}

// The executable of `key`: cached, when its static results and partial
// writes fit this call, or compiled. nullptr: the call runs exact shapes
// (and its signature from now on when XLA or the meta kernel refused the
// module; a hinted layout alone when a hint made it).
DynamicCompiled* ExecutableFor(const std::string& key, const Call& call, const c10::OperatorHandle& op,
                               const std::vector<c10::IValue>& args, const DynamicLayout& lay, SignatureState* st) {
  DynamicState& state = State();
  auto found = state.executables.find(key);
  if (found != state.executables.end()) {
    DynamicCompiled* dc = &found->second;
    if (!ExecutableFits(*dc, call, lay))
      return nullptr;
    CountDynamicHit();
    return dc;
  }
  DynamicCompiled* dc = nullptr;
  bool unfit = false;
  try {
    dc = CompileDynamic(key, call, op, args, lay, &unfit);
  } catch (const lowering::Unsupported&) {
    t_exact_reason = "its rule cannot lower the module at the bucket's sizes";
  } catch (const pjrt::Error&) {  // XLA cannot pad this module: exact shapes for the signature
    t_exact_reason = "XLA could not pad this signature's module";
  } catch (const c10::Error&) {  // the meta kernel refuses the bucket's sizes
    t_exact_reason = "the meta kernel refused the bucket's sizes";
  } catch (const std::exception&) {  // ... a Python one (a decomposition such as addmm's) raises python_error
    t_exact_reason = "building the bounded module raised (a Python meta kernel, or a torch_tpu bug)";
  }
  if (!dc && !unfit) {  // (unfit: exact for this call's sizes only)
    if (lay.hinted) {
      state.failed.insert(key);
    } else {
      st->exact_only = true;
      st->exact_because = t_exact_reason;
    }
    ++Counters().exact_fallbacks;
  }
  return dc;
}

}  // namespace

bool g_dynamic_active = ModeRef() != DynamicMode::Off;

void ResultLayout::Apply(runtime::DeviceStorage* s, pjrt::BufferPtr buffer) const {
  if (padded.empty()) return s->Set(std::move(buffer));
  s->SetPadded(std::move(buffer), real, padded);
  s->product_dims = product;
}

bool CarriesDynamicHints(const at::Tensor& t) {
  return g_any_hints && (HintsOf(t) || (t.is_view() && HintsOf(at::Tensor(t._base()))));
}
DynamicMode GetDynamicMode() { return ModeRef(); }
void SetDynamicMode(const std::string& mode) {
  ModeRef() = ParseMode(mode);
  UpdateActive();
  ClearBoundedFastEntries();  // their calls may run exact now
}

void MarkDims(const at::Tensor& t, const std::vector<int64_t>& dims, bool dynamic, int64_t min,
              int64_t max) {
  DynamicHints& h = MutableHints(t);
  for (int64_t d : dims) {
    TORCH_CHECK(d >= 0 && d < t.dim(), "mark_dynamic: dim ", d, " out of range for a ", t.dim(), "-d tensor");
    h.dims[d] = DimHint{dynamic, min, max};
  }
}

std::vector<std::string> DimHintsOf(const at::Tensor& t) {
  std::vector<std::string> out(static_cast<size_t>(t.dim()));
  if (const DynamicHints* h = HintsOf(t))
    for (const auto& [d, hint] : h->dims)
      if (d < t.dim()) out[d] = hint.dynamic ? "dynamic" : "static";
  return out;
}
DynamicCounters DynamicStats() { return Counters(); }
const char* ExactReason() {
  return g_dynamic_active ? t_exact_reason : "dynamic shapes off (TORCH_TPU_DYNAMIC_SHAPES=0)";
}
void CountCompile(const std::string& op, bool dynamic, const char* reason) {
  DynamicCounters& c = Counters();
  ++c.compiles_by_op[op];
  if (dynamic) ++c.dynamic_compiles_by_op[op];
  else ++c.exact_reasons[op][reason ? reason : ExactReason()];
}
pjrt::ExecutablePtr GetOrCompileCounted(const std::string& key, int device,
                                        const std::function<std::string()>& build, const std::string& op,
                                        bool dynamic) {
  bool compiled = false;
  pjrt::ExecutablePtr exe = GetRuntime().GetOrCompile(key, device, build, &compiled);
  if (compiled) CountCompile(op, dynamic);
  return exe;
}
void CountDynamicExecutable() { ++Counters().executables; }
void CountDerivedSpecs() { ++Counters().derived_specs; }
void CountDynamicHit(bool hit_path) {
  ++Counters().hits;
  Counters().hit_path_hits += hit_path;
  ++GetRuntime().stats().cache_hits;
}
void ForgetDynamicSizes() {
  State().signatures.clear();
  State().families.clear();
  ForgetSpecModels();
  ClearBoundedFastEntries();  // the next call of each signature compiles static again
}

int64_t DynamicBucket(int64_t s) { return Bucket(s); }
int64_t SmallBucketAmong(const std::set<int64_t>& warm, int64_t size, int64_t row_bytes) {
  auto b = warm.lower_bound(size);
  if (b != warm.end() && AffordablePadding(size, *b, row_bytes)) return *b;
  const int64_t coarse = Bucket(size);
  return AffordablePadding(size, coarse, row_bytes) ? coarse : FineSmallBucket(size);
}
pjrt::BufferPtr PaddedBuffer(runtime::DeviceStorage* s, const std::vector<int64_t>& real,
                             const std::vector<int64_t>& padded, int device) {
  return PaddedStorageBuffer(s, StorageLayout{real, padded}, device);
}
Value PadDynamicResult(hlo::Builder& b, Value v, const std::vector<bool>& dyn) {
  std::vector<int64_t> order(dyn.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int64_t>(d);
  return PadDynamic(b, v, dyn, order, v.shape());
}
void CountExactFallback(const std::string& op, const std::string& reason) {
  DynamicCounters& c = Counters();
  ++c.exact_fallbacks;
  ++c.exact_reasons[op][reason];
}

void ClearDynamicExecutables() {
  DynamicState& s = State();
  s.executables.clear();
  s.specs.clear();
  s.failed.clear();
}

std::string DynamicSignature(const Call& call, const std::vector<c10::IValue>& args, std::vector<bool>* fixed) {
  std::vector<bool> parameters = ParameterInputs(call.plan, args);
  std::string sig = Signature(call.plan, parameters, FrontWindowInputs(call));
  if (fixed) *fixed = std::move(parameters);
  return sig;
}

const std::vector<OutputSpec>* DynamicSpecs(const std::string& key) {
  if (!g_dynamic_active) return nullptr;
  auto& specs = State().specs;
  auto it = specs.find(key);
  return it == specs.end() ? nullptr : &it->second;
}

namespace {

// The other buckets each dynamic size of the call may take instead of its
// own, sizes with none left out:
// - a large size: the larger buckets a dim of that size has run at, up to
//   1.25x its own, or further where the padding is affordable
//   (AffordablePadding: a prompt of 22 tokens in a warm 36-bucket while
//   that costs each tensor at most the slack);
// - a small size: the buckets a dim of that size has run at which hold it,
//   and its own Bucket(). A small size's choice may follow a buffer or a
//   coincidence (BucketSizes: a batch of 6 and a decoder length of 6 share
//   the larger choice, 16), a combination no earlier call ran.
// Product buckets keep theirs.
std::map<int64_t, std::vector<int64_t>> BucketOptions(const Call& call, const SignatureState& st,
                                                      const DynamicLayout& lay) {
  std::map<int64_t, std::vector<int64_t>> options;
  const Plan& plan = call.plan;
  const std::map<int64_t, int64_t> rows = RowBytes(call, lay.in_dynamic);
  for (size_t i = 0; i < plan.inputs.size(); ++i)
    for (size_t d = 0; d < lay.in_dynamic[i].size(); ++d) {
      const int64_t size = plan.inputs[i].geometry.sizes[d], own = lay.in_bucket[i][d];
      if (!lay.in_dynamic[i][d] || lay.in_product[i][d]) continue;
      const bool small = size <= kSmallBucket;
      auto small_fits = [&](int64_t b) { return b >= size && b != own && AffordablePadding(size, b, rows.at(size)); };
      std::vector<int64_t>& choices = options[size];
      if (small && small_fits(Bucket(size))) choices.push_back(Bucket(size));
      const auto& run_at = small ? st.small_buckets : st.large_buckets;
      auto run = run_at.find({i, d});
      if (run == run_at.end()) continue;
      for (int64_t b : run->second)
        if (small ? small_fits(b) : b > own && (4 * b <= 5 * own || LargeAffordable(size, b, rows.at(size))))
          choices.push_back(b);
    }
  for (auto it = options.begin(); it != options.end();) {
    std::sort(it->second.begin(), it->second.end());
    it->second.erase(std::unique(it->second.begin(), it->second.end()), it->second.end());
    it = it->second.empty() ? options.erase(it) : std::next(it);
  }
  return options;
}

// The most any input of the call is padded in its large dynamic dims (the
// dims BucketOptions may move to larger buckets): the product of their
// buckets over their sizes. Small dims (a batch) take only buckets some call
// of theirs ran at, and product dims keep theirs, so their padding is left
// out: a batch of 3 in batch 5's bucket 8 still takes a warm 36-bucket for
// its 30 tokens.
double MostPadding(const Plan& plan, const DynamicLayout& lay) {
  double most = 1.0;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const std::vector<int64_t>& sizes = plan.inputs[i].geometry.sizes;
    double padding = 1.0;
    for (size_t d = 0; d < sizes.size(); ++d)
      if (lay.in_dynamic[i][d] && !lay.in_product[i][d] && sizes[d] > kSmallBucket)
        padding *= static_cast<double>(lay.in_bucket[i][d]) / static_cast<double>(sizes[d]);
    most = std::max(most, padding);
  }
  return most;
}

// The most bytes the call's padding adds to any of its tensors at `lay`'s
// buckets: each input's, and each result's, whose dims of a dynamic size
// take the largest bucket that size has in the call.
int64_t MostExtraBytes(const Call& call, const DynamicLayout& lay) {
  const Plan& plan = call.plan;
  std::map<int64_t, int64_t> bucket_of;  // dynamic size -> its largest bucket
  int64_t most = 0;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const std::vector<int64_t>& sizes = plan.inputs[i].geometry.sizes;
    int64_t padded = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int64_t b = lay.in_dynamic[i][d] ? lay.in_bucket[i][d] : sizes[d];
      if (lay.in_dynamic[i][d]) bucket_of[sizes[d]] = std::max(bucket_of[sizes[d]], b);
      padded *= b;
    }
    most = std::max(most, (padded - c10::multiply_integers(sizes)) * hlo::ByteSize(plan.inputs[i].dtype));
  }
  for (const OutputSpec& spec : call.specs) {
    int64_t padded = 1;
    for (int64_t size : spec.sizes) {
      auto it = bucket_of.find(size);
      padded *= it == bucket_of.end() ? size : it->second;
    }
    most = std::max(most, (padded - c10::multiply_integers(spec.sizes)) *
                              static_cast<int64_t>(c10::elementSize(spec.dtype)));
  }
  return most;
}

// Whether `alt` has an executable that fits the call; then `lay` and `key`
// become its.
bool TakeIfWarm(const Call& call, const std::string& sig, DynamicLayout&& alt, DynamicLayout* lay,
                std::string* key) {
  if (!LayOutStorages(call, &alt)) return false;
  std::string alt_key = DynamicKey(sig, call.plan, alt);
  auto found = State().executables.find(alt_key);
  if (found == State().executables.end()) return false;
  const DynamicCompiled& dc = found->second;  // as ExecutableFor checks a hit: else the call would run exact
  if (!ExecutableFits(dc, call, alt))
    return false;
  *lay = std::move(alt);
  *key = std::move(alt_key);
  return true;
}

// A call whose small sizes coincide (a batch of 3 and a decoder length of
// 3) shares the larger of their buckets; each dim's own choice may have run
// before (batch 5's bucket 8 with a length's 4). Any combination that has an
// executable is valid for the call: the key holds every bucket and layout.
bool TakeUnsharedSmallBuckets(const Call& call, const std::string& sig, const SignatureState& st,
                              const CallHints& hints, DynamicLayout* lay, std::string* key) {
  DynamicLayout alt = *lay;
  alt.in_bucket = BucketSizes(call, alt.in_dynamic, hints, st, /*share=*/false);
  ProductBuckets(call.plan, call.desc->rule->dynamic.elementwise, &alt);
  if (alt.in_bucket == lay->in_bucket) return false;
  return TakeIfWarm(call, sig, std::move(alt), lay, key);
}

// A call whose combination of buckets has no executable yet (StaticCache
// prompt 35 in a 45-long cache: its 36-bucket ran with the 44-bucket of
// prompt 34's 41-long cache, the 48-bucket with prompt 38) takes larger
// buckets some of its dims have run at, or other small buckets
// (BucketOptions), when that combination has an executable: at most
// a host re-layout of its inputs instead of a compile.
// No input may then be padded past 1.25x its elements (or what its own
// buckets pad) unless that adds at most the slack to each tensor
// (MostExtraBytes, PaddingSlackBytes): a large image of side 34 after sides
// 32 and 40 compiles its 36-bucket rather than run at 40 (1.38x its pixels)
// from then on; a small one runs at 40.
// True when it took one (`lay` and `key` are then that combination's).
bool TakeWarmerBuckets(const Call& call, const std::string& sig, const SignatureState& st, const CallHints& hints,
                       DynamicLayout* lay, std::string* key) {
  const Plan& plan = call.plan;
  if (TakeUnsharedSmallBuckets(call, sig, st, hints, lay, key)) return true;
  const std::map<int64_t, std::vector<int64_t>> options = BucketOptions(call, st, *lay);
  if (options.empty()) return false;
  std::vector<std::pair<int64_t, std::vector<int64_t>>> sizes(options.begin(), options.end());
  const double limit = std::max(1.25, MostPadding(plan, *lay));
  std::vector<size_t> pick(sizes.size(), 0);  // per size: 0 its own bucket, k its k-th warmer one
  for (int tries = 0; tries < 32; ++tries) {
    size_t g = 0;  // the next combination (an odometer over the sizes' choices)
    while (g < sizes.size() && ++pick[g] > sizes[g].second.size()) pick[g++] = 0;
    if (g == sizes.size()) return false;
    DynamicLayout alt = *lay;
    for (size_t i = 0; i < plan.inputs.size(); ++i)
      for (size_t d = 0; d < alt.in_dynamic[i].size(); ++d)
        for (size_t k = 0; k < sizes.size(); ++k)
          if (pick[k] > 0 && alt.in_dynamic[i][d] && !alt.in_product[i][d] &&
              plan.inputs[i].geometry.sizes[d] == sizes[k].first)
            alt.in_bucket[i][d] = sizes[k].second[pick[k] - 1];
    const bool affordable = MostPadding(plan, alt) <= limit || MostExtraBytes(call, alt) <= PaddingSlackBytes();
    if (affordable && TakeIfWarm(call, sig, std::move(alt), lay, key)) return true;
  }
  return false;
}

// A new signature joins its family (Signature()'s `family`: the op at other
// unit dims), whose variants its own new ones inherit dynamic dims from.
void JoinFamily(const Plan& plan, const std::vector<bool>& fixed, const std::vector<bool>& front,
                SignatureState* st) {
  std::string family;
  Signature(plan, fixed, front, &family);
  st->siblings = &State().families[family];
  st->siblings->push_back(st);
}

// The input a destination writes (its storage and view), or -1.
int WrittenInput(const Plan& plan, const Dest& dest) {
  auto offset = [&](int param) { return param >= 0 ? plan.params[param].offset : 0; };
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const TensorIn& in = plan.inputs[i];
    if (in.storage == dest.storage && in.geometry.sizes == dest.geometry.sizes &&
        in.geometry.strides == dest.geometry.strides && offset(in.offset_param) == offset(dest.offset_param))
      return static_cast<int>(i);
  }
  return -1;
}

// A partial write whose window stops short of its storage dim's end cannot
// run dynamic in that dim (WritesFit): a rotary half written into a head
// dim, `q[..., :4]` of 8, whose width went dynamic because another model's
// call of the signature wrote `[..., :2]`. The signature keeps that dim
// static from now on, in the written input and in each input broadcast
// against it (the dim aligned from the right, of the same size), and the
// call runs bounded in its other dims. False when nothing new is pinned, no
// other dim is dynamic (pinned, the call would compile per size as it does
// exact), or the inputs do not line up as an elementwise write's.
bool PinShortWrites(const Plan& plan, const DynamicLayout& lay, SignatureState* st) {
  const ShortWrite w = std::exchange(t_short_write, ShortWrite{});
  if (w.dest < 0 || static_cast<size_t>(w.dest) >= plan.dests.size()) return false;
  const int written = WrittenInput(plan, plan.dests[w.dest]);
  if (written < 0) return false;
  const std::vector<int64_t>& sizes = plan.inputs[written].geometry.sizes;
  const int64_t from_end = static_cast<int64_t>(sizes.size()) - static_cast<int64_t>(w.dim);
  std::vector<std::pair<size_t, size_t>> pins;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const std::vector<int64_t>& other = plan.inputs[i].geometry.sizes;
    const int64_t d = static_cast<int64_t>(other.size()) - from_end;
    if (d < 0 || other[d] == 1) continue;
    if (other[d] != sizes[w.dim]) return false;  // not an elementwise write's inputs
    pins.emplace_back(i, static_cast<size_t>(d));
  }
  bool others = false;  // a dynamic dim left after the pins
  for (size_t i = 0; i < lay.in_dynamic.size(); ++i)
    for (size_t d = 0; d < lay.in_dynamic[i].size(); ++d)
      others |= lay.in_dynamic[i][d] && std::find(pins.begin(), pins.end(), std::make_pair(i, d)) == pins.end();
  if (!others) return false;
  const size_t before = st->pinned.size();
  st->pinned.insert(pins.begin(), pins.end());
  return st->pinned.size() > before;
}

// A call of a signature with dynamic dims on its bounded executable;
// nullopt: it runs exact shapes.
std::optional<std::vector<c10::IValue>> RunBounded(Call& call, const c10::OperatorHandle& op,
                                                   const std::vector<c10::IValue>& args, FastCall& fast) {
  DynamicMode mode = ModeRef();
  if (!Eligible(call)) return std::nullopt;
  bool hinted = false;
  CallHints hints = HintsOfCall(call.plan, args, &hinted);
  std::vector<bool> fixed = ParameterInputs(call.plan, args);
  for (size_t i = 0; i < fixed.size(); ++i)
    if (fixed[i])
      for (auto& h : hints[i])
        if (!h) h = DimHint{false, -1, -1};
  const char* static_because = nullptr;
  if (!RuleStaticDims(call, &hints, &static_because)) return std::nullopt;
  t_exact_reason = "dynamic shapes off (TORCH_TPU_DYNAMIC_SHAPES=0)";
  if (mode == DynamicMode::Off && !hinted) return std::nullopt;
  DynamicState& state = State();
  const std::vector<bool> front = FrontWindowInputs(call);
  auto [entry, inserted] = state.signatures.try_emplace(Signature(call.plan, fixed, front));
  const std::string& sig = entry->first;
  SignatureState& st = entry->second;
  if (inserted) JoinFamily(call.plan, fixed, front, &st);
  for (const auto& [i, d] : st.pinned)
    if (i < hints.size() && d < hints[i].size()) hints[i][d] = DimHint{false, -1, -1};
  if (st.exact_only) {
    t_exact_reason = st.exact_because;
    return std::nullopt;
  }
  DynamicLayout lay;
  lay.signature = &st;
  bool static_changed = false;
  lay.in_dynamic = Observe(st, call.plan, mode, hints, &static_changed);
  if (call.desc->rule->dynamic.elementwise) AlignElementwiseDims(call.plan, hints, &lay.in_dynamic);
  t_exact_reason = !static_changed ? "first sizes of its signature"
                   : static_because ? static_because
                                    : "a new size in a dim kept static (by its rule, or mark_static)";
  if (std::none_of(lay.in_dynamic.begin(), lay.in_dynamic.end(), AnyDynamic) && !WritesPaddedWindow(call))
    return std::nullopt;
  DrainLaunches();  // a dynamic call reads (and pads) its storages' buffers itself
  SettleRecordingFor(call);  // ... and runs alone in fused eager
  for (size_t i = 0; i < hints.size(); ++i)
    for (size_t d = 0; d < hints[i].size(); ++d)
      if (hints[i][d] && hints[i][d]->dynamic && lay.in_dynamic[i][d]) {
        lay.hinted = true;
        lay.bounded |= hints[i][d]->max > 0;
      }
  lay.in_bucket = BucketSizes(call, lay.in_dynamic, hints, st);
  if (lay.hinted) UnifyHintedSizes(call.plan, hints, &lay);
  ProductBuckets(call.plan, call.desc->rule->dynamic.elementwise, &lay);
  if (!LayOutStorages(call, &lay)) return std::nullopt;
  std::string key = DynamicKey(sig, call.plan, lay);
  if (!lay.hinted && !state.executables.count(key)) TakeWarmerBuckets(call, sig, st, hints, &lay, &key);
  t_exact_reason = "XLA could not pad this signature's module";
  if (state.failed.count(key)) return std::nullopt;
  t_short_write = ShortWrite{};
  DynamicCompiled* dc = ExecutableFor(key, call, op, args, lay, &st);
  if (!dc && PinShortWrites(call.plan, lay, &st)) return RunBounded(call, op, args, fast);  // pins only grow
  if (!dc) return std::nullopt;
  state.specs[call.plan.key] = call.cached();
  if (!lay.hinted) RememberBuckets(call.plan, lay, &st);
  return LaunchDynamic(call, *dc, lay, fast);
}

}  // namespace

std::optional<std::vector<c10::IValue>> RunDynamic(Call& call, const c10::OperatorHandle& op,
                                                   const std::vector<c10::IValue>& args, FastCall& fast) {
  if (!g_dynamic_active) return std::nullopt;
  std::optional<std::vector<c10::IValue>> results = RunOnPaddedRows(call, fast);  // padded_rows.cpp
  if (!results) results = RunOnContractedRows(call, fast);
  if (!results) results = RunBounded(call, op, args, fast);
  if (results && !call.cached_specs) LearnSpecs(call, op, args);  // the next size skips the meta kernel
  return results;
}

}  // namespace torch_tpu::aten
