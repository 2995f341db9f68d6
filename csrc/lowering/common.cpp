// The rule registry, type promotion, broadcasting and view read/write.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <optional>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {

// ---------------------------------------------------------------- registry

namespace {
struct Registry {
  std::vector<std::unique_ptr<RuleEntry>> entries;
  // Per scope: name (and, for Everywhere, variant names) -> entry.
  std::map<std::string, const RuleEntry*> by_name[3];
};
Registry& GetRegistry() {
  static Registry* r = new Registry();
  return *r;
}
const RuleEntry* Lookup(Scope scope, const std::string& name) {
  const auto& names = GetRegistry().by_name[static_cast<int>(scope)];
  auto it = names.find(name);
  return it == names.end() ? nullptr : it->second;
}
}  // namespace

// ---------------------------------------------------------------- target

namespace {
std::string& Platform() {
  static std::string* p = new std::string();
  return *p;
}
}  // namespace

void SetTargetPlatform(const std::string& platform) { Platform() = platform; }
const std::string& TargetPlatform() { return Platform(); }

// ---------------------------------------------------------------- complex gate

namespace {
struct ComplexTable {
  std::map<std::string, Rule> rules;   // complex-specific rules by name
  std::map<std::string, bool> capable;  // generic rules that handle complex as is
};
ComplexTable& GetComplexTable() {
  static ComplexTable* t = new ComplexTable();
  return *t;
}

bool InvolvesComplex(const Context& c, const std::vector<Arg>& a) {
  for (const auto& t : c.outputs)
    if (hlo::IsComplex(t.dtype)) return true;
  for (const auto& x : a) {
    if ((x.kind == Arg::Kind::Tensor || x.kind == Arg::Kind::Scalar) &&
        (hlo::IsComplex(x.tensor.dtype()) || hlo::IsComplex(x.scalar_type)))
      return true;
    if (x.kind == Arg::Kind::TensorList || x.kind == Arg::Kind::ScalarList)
      for (const auto& v : x.tensors)
        if (v.valid() && hlo::IsComplex(v.dtype())) return true;
  }
  return false;
}

// Rules were written for real dtypes: with a complex input or output, the
// op's complex rule runs, or the generic one if it is marked capable, else
// the op goes to the CPU fallback (Unsupported). `name` is the gate key:
// the rule's name, "graph:<name>" for Graph-scope rules, "internal:<name>"
// for Internal ones.
Rule GateComplex(const std::string& name, Rule rule) {
  return [name, rule](Context& c, const std::vector<Arg>& a) {
    if (!InvolvesComplex(c, a)) return rule(c, a);
    const ComplexTable& t = GetComplexTable();
    auto it = t.rules.find(name);
    if (it != t.rules.end()) return it->second(c, a);
    if (t.capable.count(name)) return rule(c, a);
    throw Unsupported(name + ": complex dtypes are not native for this op");
  };
}
}  // namespace

void RegisterComplex(const std::string& name, Rule rule) {
  GetComplexTable().rules[name] = std::move(rule);
}

void MarkComplexCapable(const std::vector<std::string>& names) {
  for (const auto& n : names) GetComplexTable().capable[n] = true;
}

bool HasComplexRule(const std::string& name) {
  const ComplexTable& t = GetComplexTable();
  return t.rules.count(name) || t.capable.count(name);
}

RuleEntry& Register(const std::string& name, Rule rule, std::vector<std::string> variants,
                    Scope scope) {
  Registry& r = GetRegistry();
  auto entry = std::make_unique<RuleEntry>();
  entry->name = name;
  std::string gate_key = scope == Scope::Graph      ? "graph:" + name
                         : scope == Scope::Internal ? "internal:" + name
                                                    : name;
  entry->rule = GateComplex(gate_key, std::move(rule));
  entry->variants = variants;
  entry->scope = scope;
  auto& names = r.by_name[static_cast<int>(scope)];
  for (const auto& n : variants) names[n] = entry.get();
  names[name] = entry.get();
  r.entries.push_back(std::move(entry));
  return *r.entries.back();
}

size_t StaticDims::Rank(size_t arg) const {
  if (arg >= args_.size() || args_[arg].kind != Arg::Kind::Tensor) return 0;
  return args_[arg].tensor.shape().size();
}

void StaticDims::From(size_t arg, size_t first) {
  for (size_t d = first; d < Rank(arg); ++d) Dim(arg, d);
}

int64_t SizeInt::Of(const std::vector<int64_t>& sizes, double scale) const {
  const size_t end = last < 0 ? sizes.size() : std::min(sizes.size(), static_cast<size_t>(last));
  int64_t n = 1;
  for (size_t d = first; d < end; ++d) n *= sizes[d];
  if (scale_arg < 0) return n;
  const double scaled = divided ? static_cast<double>(n) / scale : static_cast<double>(n) * scale;
  return static_cast<int64_t>(std::floor(scaled));  // as PyTorch's output sizes
}

void StaticDims::Last(size_t arg, size_t n) {
  size_t rank = Rank(arg);
  From(arg, rank > n ? rank - n : 0);
}

void ComplexExact(const std::vector<Arg>& a, StaticDims& s) {
  if (!a.empty() && a[0].kind == Arg::Kind::Tensor && hlo::IsComplex(a[0].tensor.dtype()))
    s.Exact("a complex op over its parts");
}

namespace {
// The dims arg `dims_arg` names, wrapped to `rank` (an int, or an int list;
// nullopt: an empty list, which means every dim).
std::optional<std::vector<int64_t>> NamedDims(const std::vector<Arg>& a, size_t dims_arg, int64_t rank) {
  std::vector<int64_t> dims = a[dims_arg].kind == Arg::Kind::Int ? std::vector<int64_t>{a[dims_arg].i}
                                                                 : a[dims_arg].ints;
  if (a[dims_arg].kind != Arg::Kind::Int && dims.empty()) return std::nullopt;
  for (int64_t& d : dims) d = WrapDim(d, std::max<int64_t>(rank, 1));
  return dims;
}
}  // namespace

StaticDimsRule KeptDims(size_t dims_arg) {
  return [dims_arg](const std::vector<Arg>& a, StaticDims& s) {
    const int64_t rank = static_cast<int64_t>(s.Rank(0));
    if (dims_arg >= a.size()) return;
    std::optional<std::vector<int64_t>> reduced = NamedDims(a, dims_arg, rank);
    if (!reduced) return;  // every dim
    for (int64_t d = 0; d < rank; ++d)
      if (std::find(reduced->begin(), reduced->end(), d) == reduced->end()) s.Dim(0, static_cast<size_t>(d));
  };
}

StaticDimsRule NamedDimsStatic(size_t dims_arg, const char* because) {
  return [dims_arg, because](const std::vector<Arg>& a, StaticDims& s) {
    ComplexExact(a, s);
    const int64_t rank = static_cast<int64_t>(s.Rank(0));
    s.Because(because);
    if (rank == 0) return;
    if (dims_arg >= a.size()) return s.All(0);
    std::optional<std::vector<int64_t>> dims = NamedDims(a, dims_arg, rank);
    if (!dims) return s.All(0);
    for (int64_t d : *dims) s.Dim(0, static_cast<size_t>(d));
  };
}

StaticDimsRule IndexedDimStatic(const char* because) {
  return [because](const std::vector<Arg>& a, StaticDims& s) {
    const int64_t rank = static_cast<int64_t>(s.Rank(0));
    if (rank > 0 && a.size() > 1 && a[1].kind == Arg::Kind::Int) s.Dim(0, static_cast<size_t>(WrapDim(a[1].i, rank)));
    s.Because(because);
  };
}

uint64_t DrawPerOutputElement(const std::vector<Arg>&, const std::vector<TensorType>& outputs) {
  // The product of every output dim (one value per element of a one-output
  // op), plus one: the generator offsets eager mode has always used. A
  // 64-bit float (or complex128) output counts twice: its rules draw up to
  // two 64-bit values per element (normal_'s Box-Muller), one counter each
  // (RandomBits).
  uint64_t n = 1;
  bool wide = false;
  for (const auto& t : outputs) {
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    wide |= t.dtype == ElementType::F64 || t.dtype == ElementType::C128;
  }
  return (wide ? 2 * n : n) + 1;
}

RuleEntry& RegisterRandom(const std::string& name, Rule rule, Draws draws) {
  RuleEntry& e = Register(name, std::move(rule));
  e.draws = std::move(draws);
  return e;
}

RuleEntry& RegisterRuntimeFloats(const std::string& name, Rule rule, std::vector<std::string> args) {
  RuleEntry& e = Register(name, std::move(rule));
  e.runtime_floats = true;
  e.runtime_float_args = std::move(args);
  return e;
}

const RuleEntry* Find(const std::string& name) { return Lookup(Scope::Everywhere, name); }

const RuleEntry* FindForGraph(const std::string& name) {
  if (const RuleEntry* e = Lookup(Scope::Graph, name)) return e;
  const RuleEntry* e = Lookup(Scope::Everywhere, name);
  // Find() also answers in-place / out= variant names with the functional
  // rule; a graph needs the exact op.
  return e && e->name == name ? e : nullptr;
}

const RuleEntry* FindInternal(const std::string& name) { return Lookup(Scope::Internal, name); }

std::vector<const RuleEntry*> AllRules() {
  std::vector<const RuleEntry*> out;
  for (const auto& e : GetRegistry().entries) out.push_back(e.get());
  return out;
}

// ---------------------------------------------------------------- promotion

namespace {
int Category(ElementType t) {
  if (t == ElementType::Bool) return 0;
  if (hlo::IsComplex(t)) return 3;
  if (hlo::IsFloat(t)) return 2;
  return 1;
}
}  // namespace

ElementType PromoteTypes(ElementType a, ElementType b) {
  using E = ElementType;
  if (a == b) return a;
  if (a == E::Bool) return b;
  if (b == E::Bool) return a;
  if (hlo::IsComplex(a) || hlo::IsComplex(b)) {
    // complex128 if either side has f64 parts (complex64 + float64 too).
    bool wide = a == E::C128 || b == E::C128 || a == E::F64 || b == E::F64;
    return wide ? E::C128 : E::C64;
  }
  bool fa = hlo::IsFloat(a), fb = hlo::IsFloat(b);
  if (fa && fb) {
    if ((a == E::BF16 && b == E::F16) || (a == E::F16 && b == E::BF16)) return E::F32;
    return hlo::ByteSize(a) >= hlo::ByteSize(b) ? a : b;
  }
  if (fa) return a;
  if (fb) return b;
  bool ua = hlo::IsUnsigned(a), ub = hlo::IsUnsigned(b);
  if (ua == ub) return hlo::ByteSize(a) >= hlo::ByteSize(b) ? a : b;
  // Mixed signedness: the smallest signed type holding both.
  E u = ua ? a : b, s = ua ? b : a;
  int need = std::max(hlo::ByteSize(s), 2 * hlo::ByteSize(u));
  if (need <= 2) return E::I16;
  if (need <= 4) return E::I32;
  return E::I64;
}

namespace {
ElementType CombineCategories(bool has_higher, ElementType higher, bool has_lower,
                              ElementType lower) {
  if (!has_higher) return lower;
  if (!has_lower) return higher;
  if (Category(lower) <= Category(higher)) return higher;
  // A complex scalar or 0-d tensor with float tensors: complex of their width.
  if (hlo::IsComplex(lower) && hlo::IsFloat(higher)) return hlo::ComplexOf(higher);
  return PromoteTypes(higher, lower);
}
}  // namespace

ElementType ResultType(const std::vector<const Arg*>& args, ElementType default_float) {
  // Three priority classes, as in ATen's ResultTypeState.
  bool has[3] = {false, false, false};
  ElementType acc[3] = {ElementType::Bool, ElementType::Bool, ElementType::Bool};
  auto add = [&](int cls, ElementType t) {
    acc[cls] = has[cls] ? PromoteTypes(acc[cls], t) : t;
    has[cls] = true;
  };
  for (const Arg* a : args) {
    if (a->kind == Arg::Kind::Tensor) {
      add(a->tensor.rank() > 0 && !a->is_cpu_scalar ? 0 : 1, a->tensor.dtype());
    } else if (a->kind == Arg::Kind::Scalar) {
      ElementType t = a->scalar_type;
      if (hlo::IsFloat(t)) t = default_float;
      if (hlo::IsComplex(t)) t = hlo::ComplexOf(default_float);
      add(2, t);
    } else if (a->kind == Arg::Kind::TensorList) {
      for (const auto& v : a->tensors)
        if (v.valid()) add(v.rank() > 0 ? 0 : 1, v.dtype());
    }
  }
  bool has_low = has[1] || has[2];
  ElementType low = CombineCategories(has[1], acc[1], has[2], acc[2]);
  return CombineCategories(has[0], acc[0], has_low, low);
}

ElementType ComputeType(ElementType t) {
  return (t == ElementType::F16 || t == ElementType::BF16) ? ElementType::F32 : t;
}

int64_t WrapDim(int64_t dim, int64_t rank) {
  int64_t r = std::max<int64_t>(rank, 1);
  if (dim < -r || dim >= r)
    throw std::out_of_range("Dimension out of range (expected to be in range of [" +
                            std::to_string(-r) + ", " + std::to_string(r - 1) +
                            "], but got " + std::to_string(dim) + ")");
  return dim < 0 ? dim + r : dim;
}

std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::vector<int64_t> ReduceDims(const std::vector<int64_t>& dims, int64_t rank) {
  if (dims.empty()) return Range(rank);
  std::vector<int64_t> out;
  for (int64_t d : dims) out.push_back(rank == 0 ? 0 : WrapDim(d, rank));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (rank == 0) out.clear();
  return out;
}

std::vector<int64_t> BroadcastShapes(const std::vector<int64_t>& a,
                                     const std::vector<int64_t>& b) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw std::invalid_argument("shapes cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

Value MaxMin(Builder& b, Value x, Value y, bool is_max) {
  if (x.dtype() == ElementType::Bool) return b.Binary(is_max ? "or" : "and", x, y);
  Value r = b.Binary(is_max ? "maximum" : "minimum", x, y);
  if (!hlo::IsFloat(x.dtype())) return r;
  r = b.Select(b.Compare("NE", y, y), y, r);
  return b.Select(b.Compare("NE", x, x), x, r);
}

Value Coordinates(Builder& b, Value index, int64_t dim) {
  std::vector<int64_t> shape = index.shape(), column = shape;
  column.push_back(1);
  Value idx = b.Convert(index, ElementType::I64);
  std::vector<Value> cols;
  for (int64_t d = 0; d < index.rank(); ++d) {
    Value v = d == dim ? idx : b.Iota(TensorType{ElementType::I64, shape}, d);
    cols.push_back(b.Reshape(v, column));
  }
  return b.Concatenate(cols, index.rank());
}

Value ElementCount(Builder& b, const Value& x, const std::vector<int64_t>& dims, int64_t times, ElementType t) {
  int64_t fixed = times;
  Value n;
  for (int64_t d : dims) {
    if (d >= static_cast<int64_t>(x.type.dynamic.size()) || !x.type.dynamic[d]) {
      fixed *= x.shape()[d];
      continue;
    }
    Value size = b.GetDimensionSize(x, d);
    n = n.valid() ? b.Binary("multiply", n, size) : size;
  }
  if (!n.valid()) return b.Constant(t, static_cast<double>(fixed));
  return b.Convert(b.Binary("multiply", n, b.ConstantInt(ElementType::I32, fixed)), t);
}

Value BroadcastCount(Builder& b, const Value& x, const Value& y, const std::vector<int64_t>& shape, ElementType t) {
  int64_t fixed = 1;
  Value n;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    Value size;  // the runtime size of a dim dynamic in x or y
    for (const Value* v : {&x, &y}) {
      const int64_t vd = d - static_cast<int64_t>(shape.size()) + v->rank();
      if (vd >= 0 && vd < static_cast<int64_t>(v->type.dynamic.size()) && v->type.dynamic[vd])
        size = ElementCount(b, *v, {vd}, 1, t);
    }
    if (!size.valid()) fixed *= shape[d];
    else n = n.valid() ? b.Binary("multiply", n, size) : size;
  }
  Value count = b.Constant(t, static_cast<double>(fixed));
  return n.valid() ? b.Binary("multiply", n, count) : count;
}

Value StaticFilled(Builder& b, Value x, double fill) {
  return x.type.is_dynamic() ? StaticFilled(b, x, b.Constant(x.dtype(), fill)) : x;
}

std::vector<Value> RealSizes(Builder& b, const Value& x) {
  std::vector<Value> real(x.shape().size());
  for (size_t d = 0; d < x.type.dynamic.size() && d < real.size(); ++d)
    if (x.type.dynamic[d]) real[d] = b.GetDimensionSize(x, static_cast<int64_t>(d));
  return real;
}

Value WithRealSizes(Builder& b, Value x, const std::vector<Value>& real) {
  for (size_t d = 0; d < real.size() && d < x.shape().size(); ++d)
    if (real[d].valid()) x = b.SetDimensionSize(x, real[d], static_cast<int64_t>(d));
  return x;
}

Value RealElements(Builder& b, const Value& x) {
  Value inside;
  const std::vector<Value> real = RealSizes(b, x);
  for (int64_t d = 0; d < static_cast<int64_t>(real.size()); ++d) {
    if (!real[d].valid()) continue;
    Value pos = b.Iota(TensorType{ElementType::I32, x.shape()}, d);
    Value in_d = b.Compare("LT", pos, b.BroadcastInDim(real[d], x.shape(), {}));
    inside = inside.valid() ? b.Binary("and", inside, in_d) : in_d;
  }
  return inside;
}

Value StaticFilled(Builder& b, Value x, Value fill) {
  Value inside = RealElements(b, x);
  if (!inside.valid()) return x;
  for (int64_t d = 0; d < static_cast<int64_t>(x.type.dynamic.size()); ++d)
    if (x.type.dynamic[d]) x = b.SetDimensionSize(x, b.ConstantInt(ElementType::I32, x.shape()[d]), d, true);
  return b.Select(inside, x, b.BroadcastInDim(fill, x.shape(), {}));
}

Value As(Builder& b, Value v, ElementType t, const std::vector<int64_t>& shape) {
  return b.BroadcastTo(b.Convert(v, t), shape);
}

Value As(Builder& b, const Arg& a, ElementType t, const std::vector<int64_t>& shape) {
  if (a.kind != Arg::Kind::Tensor && a.kind != Arg::Kind::Scalar)
    throw std::logic_error("lowering: expected a tensor or scalar argument");
  return As(b, a.tensor, t, shape);
}

namespace {
// `idx` as i64, checked in [-n, n) (or [0, n)) and negatives wrapped: `n`
// the dim's size (a rank-0 i64), `message` the error's.
Value CheckedAgainst(Context& c, Value idx, Value n, bool allow_negative, const std::string& message) {
  Builder& b = c.b;
  Value i = b.Convert(idx, ElementType::I64);
  const auto& shape = i.shape();
  Value zero = b.Splat(ElementType::I64, 0, shape);
  if (!shape.empty()) n = b.BroadcastInDim(n, shape, {});
  Value low = allow_negative ? b.Unary("negate", n) : zero;
  Value in_range = b.Binary("and", b.Compare("GE", i, low), b.Compare("LT", i, n));
  Value all = b.Reduce(in_range, b.ConstantInt(ElementType::Bool, 1), Range(i.rank()), "and");
  c.Require(all, message);
  if (!allow_negative) return i;
  return b.Select(b.Compare("LT", i, zero), b.Binary("add", i, n), i);
}
}  // namespace

Value CheckedIndex(Context& c, Value idx, int64_t size, bool allow_negative,
                   const std::string& what) {
  return CheckedAgainst(c, idx, c.b.ConstantInt(ElementType::I64, size), allow_negative,
                        what + ": index out of range for a dimension of size " + std::to_string(size));
}

Value CheckedIndexInDim(Context& c, Value idx, Value x, int64_t dim, bool allow_negative, const std::string& what) {
  Value size = c.b.Convert(c.b.GetDimensionSize(x, dim), ElementType::I64);
  const bool dynamic = dim < static_cast<int64_t>(x.type.dynamic.size()) && x.type.dynamic[dim];
  return CheckedAgainst(c, idx, size, allow_negative,
                        what + ": index out of range for dimension " + std::to_string(dim) +
                            (dynamic ? "" : " of size " + std::to_string(x.shape()[dim])));
}

// ---------------------------------------------------------------- views

namespace {
// std::to_chars, not snprintf: this runs for every dim of every tensor of
// every eager call (cache keys), where printf's format parsing was ~6% of a
// cached op's host time.
void AppendInt(std::string* s, int64_t v) {
  char buf[24];
  auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  s->append(buf, static_cast<size_t>(end - buf));
}
void AppendInts(std::string* s, const std::vector<int64_t>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s->append(", ");
    AppendInt(s, v[i]);
  }
}
}  // namespace

void ViewGeometry::AppendKey(std::string* k) const {
  k->push_back('[');
  AppendInts(k, sizes);
  k->push_back('|');
  AppendInts(k, strides);
  k->push_back('|');
  AppendInt(k, storage_numel);
  k->append(whole ? "|w]" : "]");
}

std::string ViewGeometry::key() const {
  std::string k;
  AppendKey(&k);
  return k;
}

namespace {

int64_t Numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// If the view is a permutation of a dense block of numel elements, returns
// the permutation (dims ordered outermost first); else empty.
bool DensePermutation(const ViewGeometry& g, std::vector<int64_t>* perm) {
  int64_t rank = static_cast<int64_t>(g.sizes.size());
  perm->resize(rank);
  std::iota(perm->begin(), perm->end(), 0);
  std::stable_sort(perm->begin(), perm->end(), [&](int64_t a, int64_t b) {
    return g.strides[a] > g.strides[b];
  });
  int64_t expected = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    int64_t d = (*perm)[i];
    if (g.sizes[d] == 1) continue;
    if (g.strides[d] != expected) return false;
    expected *= g.sizes[d];
  }
  return true;
}

Value FlatIndices(Builder& b, Value offset, const ViewGeometry& g) {
  TensorType t{ElementType::I64, g.sizes};
  Value idx = b.BroadcastInDim(offset, g.sizes, {});
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.sizes[d] == 1 || g.strides[d] == 0) continue;
    Value term = b.Binary("multiply", b.Iota(t, static_cast<int64_t>(d)),
                          b.Splat(ElementType::I64, static_cast<double>(g.strides[d]), g.sizes));
    idx = b.Binary("add", idx, term);
  }
  std::vector<int64_t> shape = g.sizes;
  shape.push_back(1);
  return b.Reshape(idx, shape);
}

}  // namespace

Value ReadView(Builder& b, Value storage, Value offset, const ViewGeometry& g) {
  ElementType t = storage.dtype();
  int64_t numel = Numel(g.sizes);
  if (g.whole) return b.Reshape(storage, g.sizes);
  if (numel == 0) return b.Splat(t, 0, g.sizes);
  std::vector<int64_t> perm;
  if (DensePermutation(g, &perm)) {
    Value flat = b.DynamicSlice(storage, {offset}, {numel});
    std::vector<int64_t> permuted;
    for (int64_t d : perm) permuted.push_back(g.sizes[d]);
    std::vector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
    return b.Transpose(b.Reshape(flat, permuted), inverse);
  }
  return b.Gather(storage, FlatIndices(b, offset, g), {0});
}

Value WriteView(Builder& b, Value storage, Value offset, const ViewGeometry& g,
                Value update) {
  int64_t numel = Numel(g.sizes);
  if (g.whole) return b.Reshape(update, {g.storage_numel});
  if (numel == 0) return storage;
  std::vector<int64_t> perm;
  if (DensePermutation(g, &perm)) {
    Value flat = b.Reshape(b.Transpose(update, perm), {numel});
    return b.DynamicUpdateSlice(storage, flat, {offset});
  }
  return b.Scatter(storage, FlatIndices(b, offset, g), update, {0}, "assign");
}

}  // namespace torch_tpu::lowering
