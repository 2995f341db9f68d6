// The lowering table: ONE rule per ATen op, abstract values in, StableHLO
// out. Rules know ATen semantics (promotion, broadcasting, dims) but nothing
// of PJRT or of torch's C++ types, so eager ops, fused chains and
// torch.compile graphs all call the same rules.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "hlo/builder.h"

namespace torch_tpu::lowering {

using hlo::Builder;
using hlo::ElementType;
using hlo::TensorType;
using hlo::Value;

// One argument of an ATen call, in schema order.
struct Arg {
  enum class Kind {
    None,        // an omitted optional
    Tensor,      // `tensor` holds the (already read) value
    TensorList,  // `tensors`; an invalid Value stands for None in Tensor?[]
    Scalar,      // `tensor` is a rank-0 runtime parameter of `scalar_type`
    Int,         // `i`
    IntList,     // `ints`
    Double,      // `d`, baked into the module
    Bool,        // `i` (0 or 1)
    String,      // `s`
    ScalarType,  // `dtype`
    Generator,   // `tensor` is a ui64[2] runtime parameter (seed, offset)
    ScalarList,  // Scalar[]: `tensors` are rank-0 runtime parameters; `ints`
                 // holds each one's category (static_cast<int>(ElementType))
  };
  Kind kind = Kind::None;
  Value tensor;
  std::vector<Value> tensors;
  int64_t i = 0;
  std::vector<int64_t> ints;
  double d = 0;
  std::string s;
  ElementType dtype = ElementType::F32;
  // For Scalar: the category of the Python number (Bool, I64 or F64).
  ElementType scalar_type = ElementType::F64;
  // For Tensor: a 0-d CPU tensor passed to a device op (PyTorch allows it).
  bool is_cpu_scalar = false;

  bool is_none() const { return kind == Kind::None; }
};

// Raised by a rule for inputs it does not handle: the dispatcher then runs
// the op through the CPU fallback (counted) instead of failing.
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Context {
  Builder& b;
  // What the op returns, as computed by PyTorch's meta kernels: the rule must
  // produce exactly these types (the dispatcher casts dtypes if needed).
  std::vector<TensorType> outputs;
  // torch.get_float32_matmul_precision() == "highest".
  bool fp32_highest = true;
  std::string op;
  // Default float dtype (torch.get_default_dtype()).
  ElementType default_float = ElementType::F32;

  // Device-side assertions: `ok` is a rank-0 bool computed in the module. The
  // dispatcher returns it as an extra output; the runtime raises `message`
  // (as IndexError) at the next sync point if it is false, or at once in
  // launch-blocking mode. Like CUDA's device asserts, but never a crash.
  struct Check {
    Value ok;
    std::string message;
  };
  std::vector<Check> checks;
  void Require(Value ok, std::string message) { checks.push_back({ok, std::move(message)}); }
};

using Rule = std::function<std::vector<Value>(Context&, const std::vector<Arg>&)>;

// The platform modules are built for ("cpu", "cuda", "tpu"; "" until the
// runtime starts and sets it once). A rule may emit a form one platform runs
// faster, never a different result (linalg.cpp: XLA:CPU's transposed dots).
void SetTargetPlatform(const std::string& platform);
const std::string& TargetPlatform();

// Who may call a rule. Everywhere: eager ops (registered with PyTorch's
// dispatcher under its schema name), fused chains and torch.compile graphs.
// Graph: graphs only (functional forms of views and factories, which eager
// serves natively). Internal: torch_tpu's own calls (copies), never an ATen op.
enum class Scope { Everywhere, Graph, Internal };

// Abstract arguments (Tensor args carry a Value with a type and no id) in,
// the op's output types out.
using OutputTypes = std::function<std::vector<TensorType>(const std::vector<Arg>&)>;
// How many random values one call draws (its generator advances by that).
using Draws = std::function<uint64_t(const std::vector<Arg>&, const std::vector<TensorType>&)>;

// Bounded dynamic shapes (strict eager, csrc/aten/dynamic.cpp): the dims of
// one call's tensor args that must keep their exact size when the call runs
// on a bounded-dynamic executable (the dims a rule counts with a static
// size: a norm's normalized dims, attention's head dims), by schema arg, or
// why the call runs exact shapes altogether.
class StaticDims {
 public:
  explicit StaticDims(const std::vector<Arg>& args) : args_(args) {}
  // The rank of schema arg `arg` (0 unless a tensor).
  size_t Rank(size_t arg) const;
  void Dim(size_t arg, size_t d) { dims_.push_back({arg, d}); }
  void From(size_t arg, size_t first);  // dims [first, rank)
  void All(size_t arg) { From(arg, 0); }
  void Last(size_t arg, size_t n);  // its last n dims (all when n >= rank)
  // This call runs exact shapes; `why` is a string literal (debug.report()).
  void Exact(const char* why) { exact_ = why; }
  // Why the dims are static (a string literal): debug.report()'s reason
  // when a new size in one of them compiles exact shapes.
  void Because(const char* why) { because_ = why; }
  const std::vector<std::pair<size_t, size_t>>& dims() const { return dims_; }
  const char* exact() const { return exact_; }
  const char* because() const { return because_; }

 private:
  const std::vector<Arg>& args_;
  std::vector<std::pair<size_t, size_t>> dims_;
  const char* exact_ = nullptr;
  const char* because_ = nullptr;
};
using StaticDimsRule = std::function<void(const std::vector<Arg>&, StaticDims&)>;

// Complex inputs run exact shapes (their rules work on the parts, which
// carry no runtime sizes).
void ComplexExact(const std::vector<Arg>& a, StaticDims& s);
// The dims of self (arg 0) a reduction or scan over the dims in arg
// `dims_arg` (an int list: empty is every dim; or an int) keeps: its results
// are independent along them (DynamicShapes::independent_dims).
StaticDimsRule KeptDims(size_t dims_arg);
// The dims of self (arg 0) named by int or int-list arg `dims_arg` stay
// static (a flip's or a roll's: the padding would move into the real
// elements), `because` (a string literal) says why; complex inputs run exact.
StaticDimsRule NamedDimsStatic(size_t dims_arg, const char* because);
// The dim of self (arg 0) that int arg 1 names stays static: the scatter
// family's (the indices' bound, and the padding's updates would land among
// the real elements); every other dim runs dynamic.
StaticDimsRule IndexedDimStatic(const char* because);

// An int arg (or element `element` of an int list arg) that is the product
// of dims [first, last) of tensor arg `tensor_arg` (last < 0: to its rank):
// group norm's N, C and HxW, the batch in an upsampling backward's
// input_size. When a call's value is that product, the cache key holds no
// value for it (the tensor's sizes already say it), so a new batch size
// keeps the op's dynamic signature, and a bounded-dynamic module gets it at
// the bucket's sizes.
// With `scale_arg`, the int is that product times a float arg, floored (a
// nearest upsampling's output_size[j] = floor(in[j] * scales[j])); a call
// whose scale is None keeps the int in its key.
struct SizeInt {
  size_t arg = 0, tensor_arg = 0;
  size_t first = 0;
  int64_t last = -1;
  int64_t element = -1;  // an int list arg's element; -1: an int arg
  int64_t scale_arg = -1;  // a float arg scaling the product; -1: none
  bool divided = false;    // the product divided by the scale (an upsampling backward's input size)
  // The int for these sizes (and this scale, when it has a scale_arg).
  int64_t Of(const std::vector<int64_t>& sizes, double scale = 1.0) const;
};

// One result of a rule: its type and its dims' order in memory (outermost
// first; a dense tensor).
struct OutputLayout {
  TensorType type;
  std::vector<int64_t> order;
};
// The results a rule's args give; nullopt for args it does not vouch for.
using DerivedOutputs = std::function<std::optional<std::vector<OutputLayout>>(const std::vector<Arg>&)>;

// Whether a rule may run bounded-dynamic: it stays correct when dims of its
// inputs are bounded-dynamic (XLA's dynamic padder masks its reductions and
// contractions), in its functional form and in its in-place forms on whole
// storages (out= forms run exact shapes).
struct DynamicShapes {
  bool enabled = false;
  // Integer dtypes run exact shapes (integer pow: XLA's simplifier does not
  // finish on the padded chain of squarings).
  bool integers_exact = false;
  // The dims it counts with a static size (empty: none).
  StaticDimsRule static_dims;
  // Ops on rows (csrc/aten/padded_rows.cpp): the schema args whose first
  // dim is the rows of the op (mm's self; log_softmax's input; nll_loss's
  // self and target). When each is a whole [r, k] or [r] view folding a
  // storage padded alike in two or more dims (a linear's [b, s, h] input
  // read as [b*s, h], a causal LM's [b*s, V] logits), the op runs on all the
  // buffer's rows, and its results whose first dim is r keep the rows'
  // padded layout. Rank-0 and absent args are not rows. Empty: none.
  std::vector<size_t> rows_args;
  // An op that reduces across its rows (nll_loss): in the module every rows
  // arg's padding rows are zeroed, and arg `first` takes there the value of
  // the int arg `second` (the target's ignore_index), so that they add
  // nothing. {-1, -1}: the rows are independent (padding rows stay padding).
  std::pair<int, int> neutral_rows{-1, -1};
  // Whether a call's args make its rows rows (log_softmax over its last dim
  // of a 2-d input). Empty: always.
  std::function<bool(const std::vector<Arg>&)> rows_when;
  // A matrix product contracting the columns of its first tensor arg with
  // the rows of its second (mm): when both are such folds of storages padded
  // alike (grad_output^T @ input, a linear's weight gradient), the module
  // contracts all the buffer rows with the padding rows zeroed
  // (csrc/aten/padded_rows.cpp).
  bool contracts_rows = false;
  // Each result element comes from the inputs' elements at its own index
  // (broadcast), nothing else: the module runs on the padded buffers at the
  // buckets' sizes as static arrays, with no runtime sizes set and no result
  // made static again (the padding's elements are computed and never read).
  bool elementwise = false;
  // The (arg, dim)s along which the op's result elements are independent
  // (mm's rows, a softmax's or a reduction's other dims): a call whose
  // dynamic dims are all such runs unmasked, as an elementwise one does (its
  // padding computes elements no one reads). Empty: none.
  StaticDimsRule independent_dims;
  std::vector<SizeInt> size_ints;
  // A result dim may follow its input dims in steps (a strided window: 39
  // and 40 rows give 20): its dynamic dims are found by comparing the
  // results at the bucket with those at half the bucket as well.
  bool stepped_outputs = false;
  // Its one result has the shape of tensor arg `result_like_arg` (a max
  // pooling's backward: its input's): at the bucket's sizes it takes that
  // arg's, without the meta kernel, which checks the gradient's size against
  // the input's (sizes whose buckets need not agree: 19 rows pooled to 10,
  // buckets 20 and 16). -1: the meta kernel's.
  int64_t result_like_arg = -1;
  // Tensor args read cut to their real part out of a larger storage at some
  // sizes and whole at others (attention's saved logsumexp, its rows rounded
  // up to 32: whole when the rows are a multiple of 32). Such a window at the
  // front of its storage has a whole read's signature: one family of sizes.
  std::vector<size_t> front_window_args;
  // Its results, for a rule whose PyTorch meta kernel is a Python function
  // (about 100 us a call: attention's, at each new KV length of a decode
  // loop): a new size of a dynamic signature takes them instead of that
  // kernel (csrc/aten/spec_model.cpp). nullopt (args it does not vouch
  // for): the meta kernel runs, and raises what it raises. Empty: none.
  DerivedOutputs derived_outputs;
  // A random rule that draws its bits at its inputs' real sizes (RealSizes
  // into RandomBits): it may run dynamic, masked, and draws for the real
  // elements what it draws at the exact shape. Other random draws keep
  // exact shapes.
  bool draws_at_real_sizes = false;
};

// One entry of the table: the rule and what the dispatcher must know about
// its op. Registration returns the entry so a rule file states it in place:
//   Register("native_batch_norm", Rule).extra_mutated_args = {3, 4};
struct RuleEntry {
  std::string name;                   // "add.Tensor"
  Rule rule;
  std::vector<std::string> variants;  // in-place and out= schema names
  Scope scope = Scope::Everywhere;
  // Output types when PyTorch's meta kernel cannot give them (empty: meta).
  OutputTypes output_types;
  // Outputs the meta kernel lays out with gaps (attention backward's bias
  // gradient, its last dim's stride rounded up to 16 as CUDA's kernel
  // allocates it) are made dense in the same dim order: such an output
  // could not run bounded-dynamic, and its strides mean nothing to users.
  bool dense_outputs = false;
  // Schema indices of args the op writes although its schema does not say
  // so (native_batch_norm's running stats): the rule returns their new
  // values after the op's outputs.
  std::vector<size_t> extra_mutated_args;
  // Writes that are safe to repeat (fills write one value everywhere): an
  // in-place destination may have self-overlapping elements (expand()).
  bool repeat_safe_writes = false;
  // The in-place form reads its destination for its type only (fills,
  // copies): its old elements are never laid out for the op.
  bool overwrites_destination = false;
  // A factory whose values come from scalars alone (arange, eye): a small result
  // is computed by PyTorch's CPU kernel and uploaded instead of compiling
  // per size and start (csrc/aten/host_factory.cpp).
  bool small_results_on_host = false;
  // Draws random numbers: the rule gets a Generator arg (the op's own, or
  // the default generator's state appended as the last arg when the schema
  // has none, e.g. native_dropout). Empty: not random.
  Draws draws;
  bool random() const { return static_cast<bool>(draws); }
  // float (Double) args are also passed as rank-0 runtime parameters in
  // `tensor` (and left out of the cache key): rules must then use `tensor`,
  // not `d` (learning rates of fused optimizers never recompile). Only the
  // args named in runtime_float_args when that list is not empty.
  bool runtime_floats = false;
  std::vector<std::string> runtime_float_args;
  // Bounded dynamic shapes (see DynamicShapes); Dynamic() turns them on.
  DynamicShapes dynamic;
  RuleEntry& Dynamic(StaticDimsRule static_dims = {}) {
    dynamic.enabled = true;
    dynamic.static_dims = std::move(static_dims);
    return *this;
  }
  // An elementwise rule (DynamicShapes::elementwise) that runs dynamic.
  RuleEntry& DynamicElementwise() {
    Dynamic();
    dynamic.elementwise = true;
    return *this;
  }
  bool IsRuntimeFloat(const std::string& arg) const {
    if (!runtime_floats) return false;
    if (runtime_float_args.empty()) return true;
    for (const auto& n : runtime_float_args)
      if (n == arg) return true;
    return false;
  }
};

// What a random op draws by default: one value per output element, plus one.
uint64_t DrawPerOutputElement(const std::vector<Arg>&, const std::vector<TensorType>& outputs);

// Registers `rule` under an ATen schema name ("aten::" omitted) and the
// in-place / out= variants that compute the same function.
RuleEntry& Register(const std::string& name, Rule rule, std::vector<std::string> variants = {},
                    Scope scope = Scope::Everywhere);
// Registers a rule that draws random numbers (see RuleEntry::draws).
RuleEntry& RegisterRandom(const std::string& name, Rule rule, Draws draws = DrawPerOutputElement);
// Marks an in-place random fill of its destination (`self`, arg 0) whose
// rule draws at self's real sizes (RealSizes into the random.cpp draws): it
// runs bounded-dynamic, reading self for its type only, so a new size of
// rand / randn / randint / bernoulli compiles nothing and draws the exact
// shape's values, complex fills (complex_random.cpp) too.
RuleEntry& DrawsAtRealSizes(RuleEntry& e);
// Registers a rule whose float args are runtime parameters (see
// RuleEntry::runtime_floats).
// `args`: the names of the float args that are runtime (empty: all).
RuleEntry& RegisterRuntimeFloats(const std::string& name, Rule rule,
                                 std::vector<std::string> args = {});
// The rule for an ATen op (functional or variant name) in eager mode.
const RuleEntry* Find(const std::string& name);
// The rule a graph uses for exactly this op: a Graph-scope rule first, else
// an Everywhere rule registered under this very name (not as a variant).
const RuleEntry* FindForGraph(const std::string& name);
// An Internal rule.
const RuleEntry* FindInternal(const std::string& name);

// Complex dtypes. Every registered rule is gated: when an input or output is
// complex, the rule registered here under the same gate key runs instead, or
// the generic rule itself if marked capable; otherwise the op raises
// Unsupported (CPU fallback). Rules written for real dtypes never see
// complex values by accident. Gate keys: the rule's name; "graph:<name>" for
// Scope::Graph rules, "internal:<name>" for Scope::Internal ones.
void RegisterComplex(const std::string& key, Rule rule);
void MarkComplexCapable(const std::vector<std::string>& keys);
bool HasComplexRule(const std::string& key);
std::vector<const RuleEntry*> AllRules();

struct Registrar {
  Registrar(const std::string& name, Rule rule, std::vector<std::string> variants = {}) {
    Register(name, std::move(rule), std::move(variants));
  }
};

// ---------------------------------------------------------------- helpers

// PyTorch type promotion over the participating args (Tensor and Scalar
// kinds; others are ignored).
ElementType ResultType(const std::vector<const Arg*>& args,
                       ElementType default_float = ElementType::F32);
ElementType PromoteTypes(ElementType a, ElementType b);
// Shorthands every rule file uses: the i-th output's type, a one-result
// rule's return value, zeros of a type.
inline const TensorType& Out(Context& c, size_t i = 0) { return c.outputs.at(i); }
inline std::vector<Value> One(Value v) { return {v}; }
inline Value Zeros(Builder& b, const TensorType& t) { return b.Splat(t.dtype, 0, t.shape); }
// x as a 1-element 1-d value when it is 0-d (rules that index along a dim).
inline Value AtLeast1d(Builder& b, Value x) { return x.rank() == 0 ? b.Reshape(x, {1}) : x; }
// Dtype arithmetic runs in: f32 for 16-bit floats (PyTorch's opmath).
ElementType ComputeType(ElementType t);
int64_t WrapDim(int64_t dim, int64_t rank);
// 0, 1, ..., n-1: every dim of a rank-n value (reductions, scatter/gather dims).
std::vector<int64_t> Range(int64_t n);
// Sorted, wrapped dims; an empty list means all dims.
std::vector<int64_t> ReduceDims(const std::vector<int64_t>& dims, int64_t rank);
// Converts and broadcasts an arg (Tensor or Scalar) to type/shape.
Value As(Builder& b, const Arg& a, ElementType t, const std::vector<int64_t>& shape);
Value As(Builder& b, Value v, ElementType t, const std::vector<int64_t>& shape);
std::vector<int64_t> BroadcastShapes(const std::vector<int64_t>& a,
                                     const std::vector<int64_t>& b);
// maximum / minimum with PyTorch's NaN semantics: a NaN in either operand
// wins (XLA:CPU's maximum only propagates a NaN first operand); or/and on bool.
Value MaxMin(Builder& b, Value x, Value y, bool is_max);
// Full coordinates for an elementwise gather/scatter along `dim`: shape
// index.shape + [rank]; coordinate d is `index` for d == dim, else the
// position along d.
Value Coordinates(Builder& b, Value index, int64_t dim);
// The number of elements of x along `dims`, times `times`, as a rank-0
// value of type t: counted at run time when some of those dims are
// bounded-dynamic (a ragged batch, a new image size), so that a mean never
// counts the padding.
Value ElementCount(Builder& b, const Value& x, const std::vector<int64_t>& dims, int64_t times, ElementType t);
// The number of elements of `shape`, the broadcast of x and y (a loss's
// input and target), as a rank-0 value of type t: a dim bounded-dynamic in
// either counts at run time.
Value BroadcastCount(Builder& b, const Value& x, const Value& y, const std::vector<int64_t>& shape, ElementType t);
// x with its bounded-dynamic dims made static at their bounds, the elements
// past each dim's runtime size set to `fill` (a convolution's zeros: a
// window op then runs static at the bucket, and each real result element
// equals the exact-size op's, the padding acting as its zero padding).
// Static x: x itself.
Value StaticFilled(Builder& b, Value x, double fill);
Value StaticFilled(Builder& b, Value x, Value fill);  // fill: rank 0, x's dtype (max pooling's -inf)
// Per dim of `x`: its runtime size where it is bounded dynamic (a rule's
// input in a bounded-dynamic module), else invalid (its static size).
std::vector<Value> RealSizes(Builder& b, const Value& x);
// x with dim d bounded-dynamic at runtime size real[d] where that is valid
// (RealSizes' form): a value whose RealSizes a rule then reads.
Value WithRealSizes(Builder& b, Value x, const std::vector<Value>& real);
// Per element of x (i1, x's shape): whether it is a real one, its index
// under each bounded-dynamic dim's runtime size; invalid when x is static.
Value RealElements(Builder& b, const Value& x);
// Row-major strides (in elements) of a dense tensor of these sizes.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes);

// Checked indices: records a device-side check that every element of `idx`
// (any integer type) is in [-size, size) (or [0, size) when negative indices
// are not allowed) and returns it as i64 with negatives wrapped. XLA would
// clamp out-of-range indices silently; this makes them an error instead.
Value CheckedIndex(Context& c, Value idx, int64_t size, bool allow_negative,
                   const std::string& what);
// The same against dim `dim` of `x` at its runtime size (a bounded dynamic
// dim checks, and wraps negatives by, its real size, not its bound).
Value CheckedIndexInDim(Context& c, Value idx, Value x, int64_t dim, bool allow_negative, const std::string& what);

// Random numbers (random.cpp, random_bits.cpp). The generator state
// argument of a random rule (ui64[2]: seed, offset).
const Arg& GeneratorArg(const std::vector<Arg>& args);
// Random bits (u32 or u64) of `type` from the generator state, each
// element's a function of the state and its row-major index among the real
// elements: `real` gives a dim's runtime size where it is valid (RealSizes;
// empty: all static), so a bounded-dynamic module draws the exact-shape
// module's bits for the real elements.
Value RandomBits(Builder& b, Value state, const TensorType& type, const std::vector<Value>& real = {});
// Both 32-bit words of element j's counter (u32 of `shape`), as above.
std::pair<Value, Value> RandomWords(Builder& b, Value state, const std::vector<int64_t>& shape,
                                    const std::vector<Value>& real = {});
// Uniform values in [0, 1) of `shape`, f32 (f64 when wide), from the
// mantissa bits of RandomBits.
Value Uniform01(Builder& b, Value state, const std::vector<int64_t>& shape, bool wide = false,
                const std::vector<Value>& real = {});
// Two independent uniforms per element (Box-Muller's): f32 from the two
// words of one counter; f64 from counters j and n + j (two per element).
std::pair<Value, Value> TwoUniform01(Builder& b, Value state, const std::vector<int64_t>& shape, bool wide,
                                     const std::vector<Value>& real = {});

// ---------------------------------------------------------------- views

// Where a tensor lives inside its storage buffer (a 1-D array holding the
// whole storage): sizes and strides in elements. The storage offset is a
// runtime parameter, except when the view is the whole storage.
struct ViewGeometry {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_numel = 0;
  // sizes/strides contiguous, offset 0, numel == storage_numel: the storage
  // buffer is the tensor, reshaped (no offset parameter).
  bool whole = false;
  std::string key() const;  // for cache keys
  void AppendKey(std::string* key) const;  // appends key() without temporaries
};

// The tensor's value read out of its storage buffer.
Value ReadView(Builder& b, Value storage, Value offset, const ViewGeometry& g);
// The storage buffer after writing `update` (shape g.sizes) into the view.
Value WriteView(Builder& b, Value storage, Value offset, const ViewGeometry& g,
                Value update);

}  // namespace torch_tpu::lowering
