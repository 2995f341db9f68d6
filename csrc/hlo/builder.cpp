#include "hlo/builder.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace torch_tpu::hlo {

// ------------------------------------------------------------------ types

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorType::is_dynamic() const {
  if (dynamic.size() != shape.size()) return false;
  for (bool d : dynamic)
    if (d) return true;
  return false;
}

std::string TensorType::str() const {
  std::string s = "tensor<";
  const bool dyn = is_dynamic();
  for (size_t i = 0; i < shape.size(); ++i)
    s += (dyn && dynamic[i] ? std::string("?") : std::to_string(shape[i])) + "x";
  s += Name(dtype);
  if (!dyn) return s + ">";
  s += ", #stablehlo.bounds<";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + (dynamic[i] ? std::to_string(shape[i]) : std::string("?"));
  return s + ">>";
}

std::string Ints(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::string ArrayAttr(const std::vector<int64_t>& v) {
  return v.empty() ? "array<i64>" : "array<i64: " + Ints(v) + ">";
}

static std::string List(const std::vector<int64_t>& v) { return "[" + Ints(v) + "]"; }

// ------------------------------------------------------------------ floats

namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint16_t ToBFloat16Bits(float f) {
  uint32_t u = FloatBits(f);
  if (std::isnan(f)) return 0x7fc0;
  uint32_t rounding = 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>((u + rounding) >> 16);
}

uint16_t ToHalfBits(float f) {
  uint32_t x = FloatBits(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t mant = x & 0x7fffff;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);  // overflow: inf
  if (e <= 0) {                                                 // subnormal
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry to inf
  return static_cast<uint16_t>(half);
}

// snprintf, not iostreams: with the CUDA PJRT plugin loaded, formatting a
// number through an ostream crashed inside libstdc++'s locale facets (seen
// on an H200 machine; the CPU plugin never showed it).
std::string Hex(uint64_t bits, int bytes) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%0*llX", bytes * 2,
                static_cast<unsigned long long>(bits));
  return buf;
}

// Bits of the float8 value nearest to v (ties to even), like PyTorch's
// conversions: E4M3FN has no infinities and saturates (inf too) to +-448;
// E5M2 overflows to inf. Found by search over the 128 magnitudes.
constexpr double kF8E4M3FNMax = 448.0;  // largest finite float8_e4m3fn

uint64_t ToFloat8Bits(double v, bool e4m3fn) {
  const int man_bits = e4m3fn ? 3 : 2, bias = e4m3fn ? 7 : 15;
  const uint64_t sign = std::signbit(v) ? 0x80 : 0;
  const uint64_t nan = e4m3fn ? 0x7F : 0x7E;
  if (std::isnan(v)) return sign | nan;
  auto decode = [&](int code) {  // magnitude of code (0..127); NaN/inf codes excluded below
    int e = code >> man_bits, m = code & ((1 << man_bits) - 1);
    return e == 0 ? std::ldexp(m, 1 - bias - man_bits)
                  : std::ldexp((1 << man_bits) + m, e - bias - man_bits);
  };
  const int max_code = e4m3fn ? 0x7E : 0x7B;  // largest finite magnitude
  double a = std::fabs(v);
  double max = decode(max_code);
  double half_ulp = (max - decode(max_code - 1)) / 2;
  if (a >= max + half_ulp) return sign | (e4m3fn ? max_code : 0x7C);  // E4M3FN saturates
  int best = 0;
  for (int c = 1; c <= max_code; ++c) {
    double d = std::fabs(decode(c) - a), b = std::fabs(decode(best) - a);
    if (d < b || (d == b && (c & 1) == 0)) best = c;
  }
  return sign | static_cast<uint64_t>(best);
}

// The dense<...> literal of one scalar of type t.
std::string ScalarLiteral(ElementType t, double v) {
  switch (t) {
    case ElementType::Bool: return v != 0 ? "true" : "false";
    case ElementType::F64: {
      uint64_t u;
      std::memcpy(&u, &v, 8);
      return Hex(u, 8);
    }
    case ElementType::F32: return Hex(FloatBits(static_cast<float>(v)), 4);
    case ElementType::BF16: return Hex(ToBFloat16Bits(static_cast<float>(v)), 2);
    case ElementType::F16: return Hex(ToHalfBits(static_cast<float>(v)), 2);
    case ElementType::F8E4M3FN: return Hex(ToFloat8Bits(v, true), 1);
    case ElementType::F8E5M2: return Hex(ToFloat8Bits(v, false), 1);
    case ElementType::C64: case ElementType::C128: {
      std::string zero = ScalarLiteral(RealPart(t), 0.0);
      return "(" + ScalarLiteral(RealPart(t), v) + ", " + zero + ")";
    }
    default:
      return std::to_string(static_cast<int64_t>(v));
  }
}

}  // namespace

// ------------------------------------------------------------------ builder

Builder::Builder(std::string module_name) : module_name_(std::move(module_name)) {}

std::string Builder::Ref(const Value& v) const {
  if (!v.valid()) throw std::logic_error("hlo::Builder: use of an invalid value");
  auto it = aliases_.find(v.id);
  return it == aliases_.end() ? NewName(v.id) : it->second;
}

void Builder::Emit(const std::string& line) {
  lines_.push_back(std::string(indent_ + 2, ' ') + line);
}

Value Builder::Parameter(const TensorType& type, const std::string& attrs) {
  Value v{next_id_++, type};
  params_.emplace_back(v, attrs);
  return v;
}

void Builder::SetParameterAttrs(int index, const std::string& attrs) {
  params_.at(index).second = attrs;
}

std::string Builder::Signature(const std::vector<Value>& operands,
                               const std::vector<TensorType>& results) const {
  std::string s = "(";
  for (size_t i = 0; i < operands.size(); ++i)
    s += (i ? ", " : "") + operands[i].type.str();
  s += ") -> ";
  if (results.size() == 1) return s + results[0].str();
  s += "(";
  for (size_t i = 0; i < results.size(); ++i) s += (i ? ", " : "") + results[i].str();
  return s + ")";
}

std::vector<Value> Builder::Op(const std::string& name,
                               const std::vector<Value>& operands,
                               const std::vector<TensorType>& results,
                               const std::string& attrs) {
  return OpWithRegion(name, operands, results, attrs, {}, nullptr);
}

Value Builder::Op1(const std::string& name, const std::vector<Value>& operands,
                   const TensorType& result, const std::string& attrs) {
  return Op(name, operands, {result}, attrs)[0];
}

std::vector<Value> Builder::OpWithRegion(
    const std::string& name, const std::vector<Value>& operands,
    const std::vector<TensorType>& results, const std::string& attrs,
    const std::vector<TensorType>& block_args,
    const std::function<void(const std::vector<Value>&)>& body) {
  if (!keep_dynamic_) {  // a result type copied from a dynamic operand's: printed static
    for (const auto& r : results)
      if (!r.dynamic.empty()) {
        std::vector<TensorType> stat = results;
        for (auto& t : stat) t.dynamic.clear();
        return OpWithRegion(name, operands, stat, attrs, block_args, body);
      }
  }
  std::vector<Value> outs;
  int base = next_id_;
  next_id_ += static_cast<int>(results.size());
  for (size_t i = 0; i < results.size(); ++i)
    outs.push_back(Value{base + static_cast<int>(i), results[i]});
  std::string lhs;
  if (results.size() == 1) {
    lhs = NewName(base) + " = ";
  } else if (!results.empty()) {
    lhs = NewName(base) + ":" + std::to_string(results.size()) + " = ";
  }
  std::string head = lhs + "\"" + name + "\"(";
  for (size_t i = 0; i < operands.size(); ++i) head += (i ? ", " : "") + Ref(operands[i]);
  head += ")";
  std::string tail = (attrs.empty() ? "" : " {" + attrs + "}") + std::string(" : ") +
                     Signature(operands, results);
  if (!body) {
    Emit(head + tail);
  } else {
    Emit(head + " ({");
    std::vector<Value> args;
    std::string block = "^bb0(";
    for (size_t i = 0; i < block_args.size(); ++i) {
      Value a{next_id_++, block_args[i]};
      args.push_back(a);
      block += (i ? ", " : "") + Ref(a) + ": " + a.type.str();
    }
    Emit(block + "):");
    indent_ += 2;
    body(args);
    indent_ -= 2;
    Emit("})" + tail);
  }
  // Results of a multi-result op are referenced as %base#i.
  if (results.size() > 1) {
    for (size_t i = 0; i < results.size(); ++i) {
      Value alias{next_id_++, results[i]};
      aliases_[alias.id] = NewName(base) + "#" + std::to_string(i);
      outs[i] = alias;
    }
  }
  return outs;
}

void Builder::RegionReturn(const std::vector<Value>& values) {
  std::string s = "\"stablehlo.return\"(";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + Ref(values[i]);
  s += ") : (";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + values[i].type.str();
  Emit(s + ") -> ()");
}

void Builder::Return(const std::vector<Value>& results) {
  if (returned_) throw std::logic_error("hlo::Builder: Return called twice");
  returned_ = true;
  std::string s = "\"func.return\"(";
  for (size_t i = 0; i < results.size(); ++i) s += (i ? ", " : "") + Ref(results[i]);
  s += ") : (";
  for (size_t i = 0; i < results.size(); ++i) {
    s += (i ? ", " : "") + results[i].type.str();
    result_types_.push_back(results[i].type);
  }
  Emit(s + ") -> ()");
}

std::string Builder::ToText() const {
  if (!returned_) throw std::logic_error("hlo::Builder: ToText before Return");
  std::string s = "module @" + module_name_ + " {\n  func.func public @main(";
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [v, attrs] = params_[i];
    s += (i ? ", " : "") + NewName(v.id) + ": " + v.type.str();
    if (!attrs.empty()) s += " {" + attrs + "}";
  }
  s += ") -> (";
  for (size_t i = 0; i < result_types_.size(); ++i)
    s += (i ? ", " : "") + result_types_[i].str();
  s += ") {\n";
  for (const auto& line : lines_) s += line + "\n";
  s += "  }\n";
  for (const auto& f : functions_) s += f;
  return s + "}\n";
}

// ------------------------------------------------------------------ embedded modules

namespace {

bool IsSymbolChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.';
}

// The body of `module ... {` ... `}`: the lines between the header line and
// the closing line.
std::string ModuleBody(const std::string& text) {
  size_t start = text.find_first_not_of(" \t\n");
  if (start == std::string::npos || text.compare(start, 6, "module") != 0)
    throw std::invalid_argument(
        "embedded module: the text must start with `module` (print it without locations "
        "and attribute aliases)");
  size_t header_end = text.find('\n', start);
  size_t close = text.find_last_not_of(" \t\n");
  if (header_end == std::string::npos || text[close] != '}' || text[header_end - 1] != '{')
    throw std::invalid_argument("embedded module: expected `module ... {` ... `}` on their own lines");
  size_t last_line = text.rfind('\n', close);
  if (last_line == std::string::npos || last_line < header_end)
    throw std::invalid_argument("embedded module: no closing line");
  return text.substr(header_end + 1, last_line + 1 - (header_end + 1));
}

// Names defined by `func.func [public|private] @name` in `body`.
std::vector<std::string> FunctionNames(const std::string& body) {
  std::vector<std::string> names;
  const std::string tag = "func.func ";
  for (size_t at = body.find(tag); at != std::string::npos; at = body.find(tag, at + 1)) {
    size_t sym = body.find('@', at);
    size_t eol = body.find('\n', at);
    if (sym == std::string::npos || sym > eol) continue;
    size_t end = sym + 1;
    while (end < body.size() && IsSymbolChar(body[end])) ++end;
    names.push_back(body.substr(sym + 1, end - sym - 1));
  }
  return names;
}

// `body` with every reference to a symbol in `names` prefixed (outside
// string literals) and public functions made private.
std::string RenameSymbols(const std::string& body, const std::vector<std::string>& names,
                          const std::string& prefix) {
  std::string out;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < body.size()) out += body[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c != '@') {
      out += c;
      continue;
    }
    size_t end = i + 1;
    while (end < body.size() && IsSymbolChar(body[end])) ++end;
    std::string name = body.substr(i + 1, end - i - 1);
    bool ours = std::find(names.begin(), names.end(), name) != names.end();
    out += "@" + (ours ? prefix + name : name);
    i = end - 1;
  }
  const std::string pub = "func.func public @";
  for (size_t at = out.find(pub); at != std::string::npos; at = out.find(pub, at))
    out.replace(at, pub.size(), "func.func private @");
  return out;
}

}  // namespace

std::string Builder::EmbedModule(const std::string& module_text) {
  auto it = embedded_.find(module_text);
  if (it != embedded_.end()) return it->second;
  if (module_text.find("loc(") != std::string::npos || module_text.find("\n#") != std::string::npos)
    throw std::invalid_argument("embedded module: print it without locations and aliases");
  std::string body = ModuleBody(module_text);
  std::vector<std::string> names = FunctionNames(body);
  if (std::find(names.begin(), names.end(), "main") == names.end())
    throw std::invalid_argument("embedded module: no func.func @main");
  std::string prefix = "m" + std::to_string(embedded_.size()) + "_";
  functions_.push_back(RenameSymbols(body, names, prefix));
  std::string callee = prefix + "main";
  embedded_.emplace(module_text, callee);
  return callee;
}

std::vector<Value> Builder::Call(const std::string& callee, const std::vector<Value>& args,
                                 const std::vector<TensorType>& results) {
  return Op("func.call", args, results, "callee = @" + callee);
}

std::vector<Value> Builder::CallBounded(const std::string& callee, const std::vector<Value>& args,
                                        const std::vector<TensorType>& results) {
  keep_dynamic_ = bounded_ = true;
  std::vector<Value> out = Op("func.call", args, results, "callee = @" + callee);
  keep_dynamic_ = false;
  return out;
}

// ------------------------------------------------------------------ constants

Value Builder::Constant(ElementType t, double v) {
  TensorType type{t, {}};
  return Op1("stablehlo.constant", {}, type,
             "value = dense<" + ScalarLiteral(t, v) + "> : " + type.str());
}

Value Builder::ConstantInt(ElementType t, int64_t v) {
  if (!IsInteger(t)) return Constant(t, static_cast<double>(v));
  TensorType type{t, {}};
  std::string lit = IsUnsigned(t) ? std::to_string(static_cast<uint64_t>(v))
                                  : std::to_string(v);
  return Op1("stablehlo.constant", {}, type, "value = dense<" + lit + "> : " + type.str());
}

Value Builder::ConstantBits(ElementType t, uint64_t bits) {
  TensorType type{t, {}};
  std::string lit = IsFloat(t) ? Hex(bits, ByteSize(t)) : std::to_string(bits);
  return Op1("stablehlo.constant", {}, type, "value = dense<" + lit + "> : " + type.str());
}

Value Builder::ConstantComplex(ElementType t, double re, double im) {
  if (!IsComplex(t)) throw std::logic_error("hlo::Builder: ConstantComplex of a real type");
  TensorType type{t, {}};
  std::string lit = "(" + ScalarLiteral(RealPart(t), re) + ", " +
                    ScalarLiteral(RealPart(t), im) + ")";
  return Op1("stablehlo.constant", {}, type, "value = dense<" + lit + "> : " + type.str());
}

Value Builder::Splat(ElementType t, double v, const std::vector<int64_t>& shape) {
  return BroadcastInDim(Constant(t, v), shape, {});
}

Value Builder::ConstantArray(ElementType t, const std::vector<double>& v) {
  TensorType type{t, {static_cast<int64_t>(v.size())}};
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + ScalarLiteral(t, v[i]);
  return Op1("stablehlo.constant", {}, type, "value = dense<[" + s + "]> : " + type.str());
}

Value Builder::ConstantIntArray(ElementType t, const std::vector<int64_t>& v) {
  TensorType type{t, {static_cast<int64_t>(v.size())}};
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string lit = t == ElementType::Bool ? (v[i] ? "true" : "false")
                      : IsUnsigned(t)        ? std::to_string(static_cast<uint64_t>(v[i]))
                                             : std::to_string(v[i]);
    s += (i ? ", " : "") + lit;
  }
  return Op1("stablehlo.constant", {}, type, "value = dense<[" + s + "]> : " + type.str());
}

Value Builder::IsFinite(Value x) {
  return Op1("stablehlo.is_finite", {x}, TensorType{ElementType::Bool, x.shape()});
}

Value Builder::OptimizationBarrier(Value x) {
  return Op1("stablehlo.optimization_barrier", {x}, x.type);
}

std::vector<Value> Builder::Sort(const std::vector<Value>& operands, int64_t dim, bool stable,
                                 const std::function<Value(Builder&, const std::vector<Value>&)>& before) {
  std::vector<TensorType> results, block;
  for (const Value& v : operands) {
    results.push_back(v.type);
    block.push_back({v.dtype(), {}});
    block.push_back({v.dtype(), {}});
  }
  std::string attrs = "dimension = " + std::to_string(dim) + " : i64, is_stable = " +
                      (stable ? "true" : "false");
  return OpWithRegion("stablehlo.sort", operands, results, attrs, block,
                      [&](const std::vector<Value>& a) { RegionReturn({before(*this, a)}); });
}

Value Builder::MinValue(ElementType t) {
  switch (t) {
    case ElementType::Bool: return ConstantInt(t, 0);
    case ElementType::I8: return ConstantInt(t, INT8_MIN);
    case ElementType::I16: return ConstantInt(t, INT16_MIN);
    case ElementType::I32: return ConstantInt(t, INT32_MIN);
    case ElementType::I64: return ConstantInt(t, INT64_MIN);
    case ElementType::U8: case ElementType::U16: case ElementType::U32:
    case ElementType::U64: return ConstantInt(t, 0);
    case ElementType::F8E4M3FN: return Constant(t, -kF8E4M3FNMax);  // no -inf
    default: return Constant(t, -std::numeric_limits<double>::infinity());
  }
}

Value Builder::MaxValue(ElementType t) {
  switch (t) {
    case ElementType::Bool: return ConstantInt(t, 1);
    case ElementType::I8: return ConstantInt(t, INT8_MAX);
    case ElementType::I16: return ConstantInt(t, INT16_MAX);
    case ElementType::I32: return ConstantInt(t, INT32_MAX);
    case ElementType::I64: return ConstantInt(t, INT64_MAX);
    case ElementType::U8: return ConstantInt(t, UINT8_MAX);
    case ElementType::U16: return ConstantInt(t, UINT16_MAX);
    case ElementType::U32: return ConstantInt(t, UINT32_MAX);
    case ElementType::U64: return ConstantBits(t, UINT64_MAX);
    case ElementType::F8E4M3FN: return Constant(t, kF8E4M3FNMax);  // no inf
    default: return Constant(t, std::numeric_limits<double>::infinity());
  }
}

// ------------------------------------------------------------------ elementwise

Value Builder::Unary(const std::string& op, Value x) {
  return Op1("stablehlo." + op, {x}, x.type);
}

Value Builder::Binary(const std::string& op, Value a, Value b) {
  if (!(a.type == b.type))
    throw std::logic_error("hlo::Builder: " + op + " of " + a.type.str() + " and " +
                           b.type.str());
  return Op1("stablehlo." + op, {a, b}, a.type);
}

Value Builder::Chlo(const std::string& op, const std::vector<Value>& operands) {
  if (operands.empty()) throw std::logic_error("hlo::Builder: chlo." + op + " without operands");
  for (const Value& v : operands)
    if (!(v.type == operands[0].type))
      throw std::logic_error("hlo::Builder: chlo." + op + " of " + operands[0].type.str() + " and " +
                             v.type.str());
  return Op1("chlo." + op, operands, operands[0].type);
}

Value Builder::Compare(const std::string& direction, Value a, Value b) {
  if (!(a.type == b.type))
    throw std::logic_error("hlo::Builder: compare of " + a.type.str() + " and " +
                           b.type.str());
  std::string attrs =
      "comparison_direction = #stablehlo<comparison_direction " + direction + ">";
  return Op1("stablehlo.compare", {a, b}, TensorType{ElementType::Bool, a.shape()}, attrs);
}

Value Builder::Select(Value pred, Value on_true, Value on_false) {
  return Op1("stablehlo.select", {pred, on_true, on_false}, on_true.type);
}

Value Builder::Convert(Value x, ElementType t) {
  if (x.dtype() == t) return x;
  if (t == ElementType::Bool) {  // nonzero -> true (convert would truncate)
    Value zero = BroadcastInDim(ConstantInt(x.dtype(), 0), x.shape(), {});
    return Compare("NE", x, zero);
  }
  if (t == ElementType::F8E4M3FN && x.dtype() != ElementType::F8E5M2) {
    // PyTorch saturates to +-448 (inf too) where XLA's convert gives NaN;
    // NaN stays NaN (clamp propagates it).
    Value lo = BroadcastInDim(Constant(x.dtype(), -kF8E4M3FNMax), x.shape(), {});
    Value hi = BroadcastInDim(Constant(x.dtype(), kF8E4M3FNMax), x.shape(), {});
    x = Op1("stablehlo.clamp", {lo, x, hi}, x.type);
  }
  // complex -> real keeps the real part (as PyTorch's casts); XLA has no
  // such convert.
  if (IsComplex(x.dtype()) && !IsComplex(t)) return Convert(Real(x), t);
  return Op1("stablehlo.convert", {x}, TensorType{t, x.shape()});
}

Value Builder::BitcastConvert(Value x, ElementType t) {
  return Op1("stablehlo.bitcast_convert", {x}, TensorType{t, x.shape()});
}

Value Builder::Clamp(Value lo, Value x, Value hi) {
  return Op1("stablehlo.clamp", {lo, x, hi}, x.type);
}

Value Builder::Complex(Value re, Value im) {
  if (!(re.type == im.type) || !IsFloat(re.dtype()))
    throw std::logic_error("hlo::Builder: complex of " + re.type.str() + " and " +
                           im.type.str());
  return Op1("stablehlo.complex", {re, im}, TensorType{ComplexOf(re.dtype()), re.shape()});
}

Value Builder::Abs(Value x) {
  TensorType t{IsComplex(x.dtype()) ? RealPart(x.dtype()) : x.dtype(), x.shape()};
  return Op1("stablehlo.abs", {x}, t);
}

Value Builder::Real(Value x) {
  if (!IsComplex(x.dtype())) return x;
  return Op1("stablehlo.real", {x}, TensorType{RealPart(x.dtype()), x.shape()});
}

Value Builder::Imag(Value x) {
  if (!IsComplex(x.dtype())) throw std::logic_error("hlo::Builder: imag of a real value");
  return Op1("stablehlo.imag", {x}, TensorType{RealPart(x.dtype()), x.shape()});
}

Value Builder::Fft(Value x, const std::string& type, const std::vector<int64_t>& fft_length) {
  int64_t k = static_cast<int64_t>(fft_length.size());
  if (k < 1 || k > 3 || k > x.rank())
    throw std::logic_error("hlo::Builder: fft over " + std::to_string(k) + " dims of " +
                           x.type.str());
  TensorType out = x.type;
  if (type == "RFFT") {
    out.dtype = ComplexOf(x.dtype());
    out.shape.back() = fft_length.back() / 2 + 1;
  } else if (type == "IRFFT") {
    out.dtype = RealPart(x.dtype());
    out.shape.back() = fft_length.back();
  } else if (type != "FFT" && type != "IFFT") {
    throw std::logic_error("hlo::Builder: unknown fft type " + type);
  }
  return Op1("stablehlo.fft", {x}, out,
             "fft_type = #stablehlo<fft_type " + type + ">, fft_length = " +
                 ArrayAttr(fft_length));
}

// ------------------------------------------------------------------ shapes

Value Builder::SetDimensionSize(Value x, Value size, int64_t dim, bool to_static) {
  TensorType t = x.type;
  t.dynamic.resize(t.shape.size(), false);
  t.dynamic.at(dim) = !to_static;
  if (!t.is_dynamic()) t.dynamic.clear();
  keep_dynamic_ = bounded_ = true;
  Value v = Op1("stablehlo.set_dimension_size", {x, size}, t,
                "dimension = " + std::to_string(dim) + " : i64");
  keep_dynamic_ = false;
  return v;
}

Value Builder::DynamicReshape(Value x, Value sizes, const std::vector<int64_t>& bound,
                              const std::vector<bool>& dynamic) {
  TensorType t{x.dtype(), bound, dynamic};
  if (!t.is_dynamic()) t.dynamic.clear();
  keep_dynamic_ = bounded_ = true;
  Value v = Op1("stablehlo.dynamic_reshape", {x, sizes}, t);
  keep_dynamic_ = false;
  return v;
}

Value Builder::GetDimensionSize(Value x, int64_t dim) {
  return Op1("stablehlo.get_dimension_size", {x}, TensorType{ElementType::I32, {}},
             "dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::Reshape(Value x, const std::vector<int64_t>& shape) {
  if (x.shape() == shape) return x;
  return Op1("stablehlo.reshape", {x}, TensorType{x.dtype(), shape});
}

Value Builder::BroadcastInDim(Value x, const std::vector<int64_t>& shape,
                              const std::vector<int64_t>& dims) {
  if (x.shape() == shape) return x;
  return Op1("stablehlo.broadcast_in_dim", {x}, TensorType{x.dtype(), shape},
             "broadcast_dimensions = " + ArrayAttr(dims));
}

Value Builder::BroadcastTo(Value x, const std::vector<int64_t>& shape) {
  if (x.shape() == shape) return x;
  int64_t offset = static_cast<int64_t>(shape.size()) - x.rank();
  if (offset < 0) throw std::logic_error("hlo::Builder: cannot broadcast to lower rank");
  // Size-1 dims that expand must be dropped from the mapping: reshape first.
  std::vector<int64_t> kept_shape, dims;
  for (int64_t i = 0; i < x.rank(); ++i) {
    int64_t d = x.shape()[i];
    if (d == shape[i + offset]) {
      kept_shape.push_back(d);
      dims.push_back(i + offset);
    } else if (d != 1) {
      throw std::logic_error("hlo::Builder: cannot broadcast " + x.type.str());
    }
  }
  return BroadcastInDim(Reshape(x, kept_shape), shape, dims);
}

Value Builder::Transpose(Value x, const std::vector<int64_t>& permutation) {
  bool identity = true;
  std::vector<int64_t> shape;
  for (size_t i = 0; i < permutation.size(); ++i) {
    identity &= permutation[i] == static_cast<int64_t>(i);
    shape.push_back(x.shape()[permutation[i]]);
  }
  if (identity) return x;
  Value v = Op1("stablehlo.transpose", {x}, TensorType{x.dtype(), shape},
                "permutation = " + ArrayAttr(permutation));
  transposes_[v.id] = {x, permutation};
  return v;
}

Value Builder::TransposedFrom(const Value& v, const std::vector<int64_t>& permutation) const {
  auto it = transposes_.find(v.id);
  return it != transposes_.end() && it->second.second == permutation ? it->second.first : Value{};
}

Value Builder::Slice(Value x, const std::vector<int64_t>& start,
                     const std::vector<int64_t>& limit,
                     const std::vector<int64_t>& strides) {
  std::vector<int64_t> shape;
  for (size_t i = 0; i < start.size(); ++i)
    shape.push_back(std::max<int64_t>(0, (limit[i] - start[i] + strides[i] - 1) / strides[i]));
  if (shape == x.shape()) return x;
  return Op1("stablehlo.slice", {x}, TensorType{x.dtype(), shape},
             "start_indices = " + ArrayAttr(start) + ", limit_indices = " +
                 ArrayAttr(limit) + ", strides = " + ArrayAttr(strides));
}

Value Builder::DynamicSlice(Value x, const std::vector<Value>& starts,
                            const std::vector<int64_t>& sizes) {
  std::vector<Value> operands{x};
  operands.insert(operands.end(), starts.begin(), starts.end());
  return Op1("stablehlo.dynamic_slice", operands, TensorType{x.dtype(), sizes},
             "slice_sizes = " + ArrayAttr(sizes));
}

Value Builder::DynamicUpdateSlice(Value x, Value update, const std::vector<Value>& starts) {
  std::vector<Value> operands{x, update};
  operands.insert(operands.end(), starts.begin(), starts.end());
  return Op1("stablehlo.dynamic_update_slice", operands, x.type);
}

Value Builder::Concatenate(const std::vector<Value>& xs, int64_t dim) {
  if (xs.size() == 1) return xs[0];
  TensorType type = xs.at(0).type;
  type.shape[dim] = 0;
  for (const auto& x : xs) type.shape[dim] += x.shape()[dim];
  std::vector<Value> operands = xs;
  // MLIR's type inference takes the bounds encoding of a concatenate from its
  // first operand and aborts the process when that one is static while a
  // later one is bounded-dynamic: give the first one an encoding (its own
  // size along `dim`, as a runtime size).
  bool later_dynamic = std::any_of(xs.begin() + 1, xs.end(), [](const Value& x) { return x.type.is_dynamic(); });
  if (later_dynamic && !xs[0].type.is_dynamic())
    operands[0] = SetDimensionSize(xs[0], ConstantInt(ElementType::I32, xs[0].shape()[dim]), dim);
  return Op1("stablehlo.concatenate", operands, type, "dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::Iota(const TensorType& type, int64_t dim) {
  return Op1("stablehlo.iota", {}, type, "iota_dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::Reverse(Value x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x;
  return Op1("stablehlo.reverse", {x}, x.type, "dimensions = " + ArrayAttr(dims));
}

Value Builder::Pad(Value x, Value pad_value, const std::vector<int64_t>& low,
                   const std::vector<int64_t>& high, const std::vector<int64_t>& interior) {
  std::vector<int64_t> shape = x.shape();
  for (size_t i = 0; i < shape.size(); ++i)
    shape[i] = low[i] + high[i] + shape[i] + std::max<int64_t>(0, shape[i] - 1) * interior[i];
  return Op1("stablehlo.pad", {x, pad_value}, TensorType{x.dtype(), shape},
             "edge_padding_low = " + ArrayAttr(low) + ", edge_padding_high = " +
                 ArrayAttr(high) + ", interior_padding = " + ArrayAttr(interior));
}

// ------------------------------------------------------------------ reductions

std::vector<Value> Builder::ReduceN(
    const std::vector<Value>& xs, const std::vector<Value>& inits,
    const std::vector<int64_t>& dims,
    const std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>& body) {
  std::vector<Value> operands(xs);
  operands.insert(operands.end(), inits.begin(), inits.end());
  std::vector<TensorType> results, block_args;
  for (const auto& x : xs) {
    std::vector<int64_t> shape;
    for (int64_t i = 0; i < x.rank(); ++i) {
      bool reduced = false;
      for (int64_t d : dims) reduced |= d == i;
      if (!reduced) shape.push_back(x.shape()[i]);
    }
    results.push_back(TensorType{x.dtype(), shape});
  }
  for (const auto& x : xs) block_args.push_back(TensorType{x.dtype(), {}});
  for (const auto& x : xs) block_args.push_back(TensorType{x.dtype(), {}});
  return OpWithRegion("stablehlo.reduce", operands, results,
                      "dimensions = " + ArrayAttr(dims), block_args,
                      [&](const std::vector<Value>& args) { RegionReturn(body(*this, args)); });
}

Value Builder::Reduce(Value x, Value init, const std::vector<int64_t>& dims,
                      const std::string& combiner) {
  return ReduceN({x}, {init}, dims, [&](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{b.Binary(combiner, a[0], a[1])};
  })[0];
}

Value Builder::DotGeneral(Value lhs, Value rhs, const std::vector<int64_t>& lhs_batch,
                          const std::vector<int64_t>& rhs_batch,
                          const std::vector<int64_t>& lhs_contract,
                          const std::vector<int64_t>& rhs_contract, ElementType result,
                          bool highest_precision) {
  std::vector<int64_t> shape;
  for (int64_t d : lhs_batch) shape.push_back(lhs.shape()[d]);
  auto free_dims = [&](const Value& v, const std::vector<int64_t>& batch,
                       const std::vector<int64_t>& contract) {
    for (int64_t i = 0; i < v.rank(); ++i) {
      bool used = false;
      for (int64_t d : batch) used |= d == i;
      for (int64_t d : contract) used |= d == i;
      if (!used) shape.push_back(v.shape()[i]);
    }
  };
  free_dims(lhs, lhs_batch, lhs_contract);
  free_dims(rhs, rhs_batch, rhs_contract);
  std::string dn = "dot_dimension_numbers = #stablehlo.dot<";
  std::vector<std::string> parts;
  if (!lhs_batch.empty()) parts.push_back("lhs_batching_dimensions = " + List(lhs_batch));
  if (!rhs_batch.empty()) parts.push_back("rhs_batching_dimensions = " + List(rhs_batch));
  parts.push_back("lhs_contracting_dimensions = " + List(lhs_contract));
  parts.push_back("rhs_contracting_dimensions = " + List(rhs_contract));
  for (size_t i = 0; i < parts.size(); ++i) dn += (i ? ", " : "") + parts[i];
  dn += ">";
  if (highest_precision)
    dn += ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";
  return Op1("stablehlo.dot_general", {lhs, rhs}, TensorType{result, shape}, dn);
}

Value Builder::Gather(Value x, Value indices, const std::vector<int64_t>& index_dims) {
  int64_t batch_rank = indices.rank() - 1;
  std::vector<int64_t> offset_dims, slice_sizes, shape(indices.shape().begin(),
                                                        indices.shape().end() - 1);
  for (int64_t i = 0; i < x.rank(); ++i) {
    bool indexed = false;
    for (int64_t d : index_dims) indexed |= d == i;
    slice_sizes.push_back(indexed ? 1 : x.shape()[i]);
    if (!indexed) {
      offset_dims.push_back(static_cast<int64_t>(shape.size()));
      shape.push_back(x.shape()[i]);
    }
  }
  std::string attrs = "dimension_numbers = #stablehlo.gather<";
  if (!offset_dims.empty()) attrs += "offset_dims = " + List(offset_dims) + ", ";
  attrs += "collapsed_slice_dims = " + List(index_dims) +
           ", start_index_map = " + List(index_dims) +
           ", index_vector_dim = " + std::to_string(batch_rank) +
           ">, indices_are_sorted = false, slice_sizes = " + ArrayAttr(slice_sizes);
  return Op1("stablehlo.gather", {x, indices}, TensorType{x.dtype(), shape}, attrs);
}

Value Builder::Scatter(Value x, Value indices, Value updates,
                       const std::vector<int64_t>& index_dims,
                       const std::string& combiner) {
  return Scatter(x, indices, updates, index_dims, [&](Builder& b, Value old, Value update) {
    return combiner == "assign" ? update : b.Binary(combiner, old, update);
  });
}

Value Builder::Scatter(Value x, Value indices, Value updates, const std::vector<int64_t>& index_dims,
                       const std::function<Value(Builder&, Value, Value)>& combine) {
  int64_t batch_rank = indices.rank() - 1;
  std::vector<int64_t> window_dims;
  for (int64_t i = batch_rank; i < updates.rank(); ++i) window_dims.push_back(i);
  std::string attrs = "scatter_dimension_numbers = #stablehlo.scatter<";
  if (!window_dims.empty()) attrs += "update_window_dims = " + List(window_dims) + ", ";
  attrs += "inserted_window_dims = " + List(index_dims) +
           ", scatter_dims_to_operand_dims = " + List(index_dims) +
           ", index_vector_dim = " + std::to_string(batch_rank) +
           ">, indices_are_sorted = false, unique_indices = false";
  TensorType scalar{x.dtype(), {}};
  return OpWithRegion("stablehlo.scatter", {x, indices, updates}, {x.type}, attrs,
                      {scalar, scalar}, [&](const std::vector<Value>& a) {
                        RegionReturn({combine(*this, a[0], a[1])});
                      })[0];
}

namespace {
std::string PaddingAttr(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi) {
  std::string s = "dense<[";
  for (size_t i = 0; i < lo.size(); ++i)
    s += (i ? ", [" : "[") + std::to_string(lo[i]) + ", " + std::to_string(hi[i]) + "]";
  return s + "]> : tensor<" + std::to_string(lo.size()) + "x2xi64>";
}
}  // namespace

std::vector<Value> Builder::ReduceWindow(
    const std::vector<Value>& xs, const std::vector<Value>& inits,
    const std::vector<int64_t>& result_shape, const std::vector<int64_t>& window,
    const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
    const std::vector<int64_t>& pad_lo, const std::vector<int64_t>& pad_hi,
    const std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>& body) {
  std::vector<Value> operands(xs);
  operands.insert(operands.end(), inits.begin(), inits.end());
  std::vector<TensorType> results, block_args;
  for (const auto& x : xs) results.push_back(TensorType{x.dtype(), result_shape});
  for (int rep = 0; rep < 2; ++rep)
    for (const auto& x : xs) block_args.push_back(TensorType{x.dtype(), {}});
  std::string attrs = "padding = " + PaddingAttr(pad_lo, pad_hi) +
                      ", window_dilations = " + ArrayAttr(dilations) +
                      ", window_dimensions = " + ArrayAttr(window) +
                      ", window_strides = " + ArrayAttr(strides);
  return OpWithRegion("stablehlo.reduce_window", operands, results, attrs, block_args,
                      [&](const std::vector<Value>& args) { RegionReturn(body(*this, args)); });
}

Value Builder::Convolution(Value lhs, Value rhs, const TensorType& result, const ConvGeometry& g) {
  std::string attrs =
      "batch_group_count = " + std::to_string(g.batch_groups) + " : i64" +
      ", dimension_numbers = #stablehlo.conv<" + g.lhs_spec + "x" + g.rhs_spec + "->" + g.out_spec +
      ">, feature_group_count = " + std::to_string(g.feature_groups) + " : i64" +
      ", lhs_dilation = " + ArrayAttr(g.lhs_dilation) + ", padding = " + PaddingAttr(g.pad_lo, g.pad_hi) +
      ", rhs_dilation = " + ArrayAttr(g.rhs_dilation) + ", window_strides = " + ArrayAttr(g.window_strides);
  if (g.highest_precision)
    attrs += ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";
  return Op1("stablehlo.convolution", {lhs, rhs}, result, attrs);
}

// ---------------------------------------------------------------- control flow, linalg

std::vector<Value> Builder::While(
    const std::vector<Value>& init, const std::function<Value(const std::vector<Value>&)>& cond,
    const std::function<std::vector<Value>(const std::vector<Value>&)>& body) {
  std::vector<TensorType> types;
  for (const Value& v : init) types.push_back(v.type);
  std::vector<Value> outs;
  int base = next_id_;
  next_id_ += 1;
  std::string lhs = NewName(base) + (init.size() > 1 ? ":" + std::to_string(init.size()) : "");
  std::string head = lhs + " = \"stablehlo.while\"(";
  for (size_t i = 0; i < init.size(); ++i) head += (i ? ", " : "") + Ref(init[i]);
  Emit(head + ") ({");
  auto region = [&](const std::function<void(const std::vector<Value>&)>& fill) {
    std::vector<Value> args;
    std::string block = "^bb0(";
    for (size_t i = 0; i < types.size(); ++i) {
      Value a{next_id_++, types[i]};
      args.push_back(a);
      block += (i ? ", " : "") + Ref(a) + ": " + a.type.str();
    }
    Emit(block + "):");
    indent_ += 2;
    fill(args);
    indent_ -= 2;
  };
  region([&](const std::vector<Value>& args) { RegionReturn({cond(args)}); });
  Emit("}, {");
  region([&](const std::vector<Value>& args) { RegionReturn(body(args)); });
  Emit("}) : " + Signature(init, types));
  for (size_t i = 0; i < types.size(); ++i) {
    Value v{next_id_++, types[i]};
    aliases_[v.id] = init.size() > 1 ? NewName(base) + "#" + std::to_string(i) : NewName(base);
    outs.push_back(v);
  }
  return outs;
}

std::vector<Value> Builder::If(Value pred, const std::vector<TensorType>& results,
                               const std::function<std::vector<Value>()>& on_true,
                               const std::function<std::vector<Value>()>& on_false) {
  int base = next_id_;
  next_id_ += 1;
  std::string lhs = NewName(base) + (results.size() > 1 ? ":" + std::to_string(results.size()) : "");
  Emit(lhs + " = \"stablehlo.if\"(" + Ref(pred) + ") ({");
  indent_ += 2;
  RegionReturn(on_true());
  indent_ -= 2;
  Emit("}, {");
  indent_ += 2;
  RegionReturn(on_false());
  indent_ -= 2;
  Emit("}) : " + Signature({pred}, results));
  std::vector<Value> outs;
  for (size_t i = 0; i < results.size(); ++i) {
    Value v{next_id_++, results[i]};
    aliases_[v.id] = results.size() > 1 ? NewName(base) + "#" + std::to_string(i) : NewName(base);
    outs.push_back(v);
  }
  return outs;
}

Value Builder::Cholesky(Value a, bool lower) {
  return Op1("stablehlo.cholesky", {a}, a.type, std::string("lower = ") + (lower ? "true" : "false"));
}

Value Builder::TriangularSolve(Value a, Value rhs, bool left, bool lower, bool unit_diagonal,
                               bool transpose) {
  auto flag = [](bool v) { return v ? "true" : "false"; };
  std::string attrs = std::string("left_side = ") + flag(left) + ", lower = " + flag(lower) +
                      ", unit_diagonal = " + flag(unit_diagonal) +
                      ", transpose_a = #stablehlo<transpose " +
                      (transpose ? "TRANSPOSE" : "NO_TRANSPOSE") + ">";
  return Op1("stablehlo.triangular_solve", {a, rhs}, rhs.type, attrs);
}

std::vector<Value> Builder::CustomCall(const std::string& target,
                                       const std::vector<Value>& operands,
                                       const std::vector<TensorType>& results,
                                       const std::string& backend_config) {
  std::string attrs = "call_target_name = \"" + target + "\", api_version = 1 : i32";
  if (!backend_config.empty()) attrs += ", backend_config = \"" + backend_config + "\"";
  return Op("stablehlo.custom_call", operands, results, attrs);
}

}  // namespace torch_tpu::hlo
