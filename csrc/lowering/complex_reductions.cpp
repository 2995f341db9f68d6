// Complex reductions as ATen computes them on CPU:
//  - var / std / var_mean / std_mean (.correction): var(re) + var(im) by the
//    real rule (ATen's std_var_out splits the parts the same way), std its
//    square root, the mean complex(mean(re), mean(im));
//  - logsumexp: shifted by the max of the real parts (an infinite max by 0),
//    then the complex exp / sum / log (C99's special values, as std::);
//  - torch.norm's overloads (norm.Scalar, ...): the real rule of the moduli;
//  - vdot: sum(conj(a) * b) by the dot rule; renorm: slices scaled by a real
//    factor from the moduli's norms.
#include <algorithm>
#include <cmath>

#include "lowering/complex_common.h"

namespace torch_tpu::lowering {
namespace {

using complex_parts::Delegate;
using complex_parts::PartOf;
using complex_parts::PartType;
using complex_parts::TensorArg;
using K = Arg::Kind;

// The real rule `op` run on the real and on the imaginary part of self (arg
// 0), under the part types of the outputs.
std::pair<std::vector<Value>, std::vector<Value>> OnParts(Context& c, const std::string& op,
                                                          const std::vector<Arg>& a) {
  std::vector<TensorType> outs;
  for (const auto& t : c.outputs) outs.push_back(PartType(t));
  std::vector<Arg> re = a, im = a;
  re[0] = PartOf(c.b, a[0], false);
  im[0] = PartOf(c.b, a[0], true);
  return {Delegate(c, op, outs, re), Delegate(c, op, outs, im)};
}

// var.correction / std.correction / var_mean.correction / std_mean.correction.
Rule ComplexVar(bool take_sqrt, bool with_mean) {
  return [take_sqrt, with_mean](Context& c, const std::vector<Arg>& a) {
    Builder& b = c.b;
    auto [re, im] = OnParts(c, with_mean ? "var_mean.correction" : "var.correction", a);
    Value var = b.Binary("add", re[0], im[0]);
    if (take_sqrt) var = b.Unary("sqrt", var);
    std::vector<Value> out{var};
    if (with_mean) out.push_back(b.Complex(re[1], im[1]));
    return out;
  };
}

// logsumexp(self, dim, keepdim): m = amax(real(self)) (0 where infinite);
// log(sum(exp(self - m))) + m, as ATen's logsumexp_out_impl for complex.
std::vector<Value> ComplexLogSumExp(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = b.Convert(a.at(0).tensor, out.dtype);
  if (x.rank() == 0) x = b.Reshape(x, {1});  // log(exp(z)) still wraps the phase
  std::vector<int64_t> dims = ReduceDims(a.at(1).ints, x.rank());
  std::vector<int64_t> kept, reduced_shape;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
      kept.push_back(d);
      reduced_shape.push_back(x.shape()[d]);
    }
  Value re = b.Real(x);
  ElementType pt = re.dtype();
  Value m = b.ReduceN({re}, {b.Constant(pt, -INFINITY)}, dims,
                      [](Builder& rb, const std::vector<Value>& v) {
                        return std::vector<Value>{MaxMin(rb, v[0], v[1], true)};
                      })[0];
  Value inf = b.Compare("EQ", b.Unary("abs", m), b.Splat(pt, INFINITY, m.shape()));
  m = b.Select(inf, b.Splat(pt, 0, m.shape()), m);
  Value mc = b.Complex(m, b.Splat(pt, 0, m.shape()));
  Value shifted = b.Binary("subtract", x, b.BroadcastInDim(mc, x.shape(), kept));
  Value sum = b.Reduce(complex_parts::ExpC99(b, shifted), b.ConstantComplex(out.dtype, 0, 0), dims, "add");
  Value r = b.Binary("add", complex_parts::LogC99(b, sum), mc);
  return One(b.Reshape(r, out.shape));
}

// A reduction of complex values that is the real rule's of their moduli.
Rule OfModuli(const std::string& op) {
  return [op](Context& c, const std::vector<Arg>& a) {
    std::vector<Arg> args = a;
    args[0] = TensorArg(complex_parts::AbsC99(c.b, a.at(0).tensor));
    return Delegate(c, op, c.outputs, args);
  };
}

std::vector<Value> ComplexVdot(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value x = b.Convert(a.at(0).tensor, Out(c).dtype);
  Value conj = b.Complex(b.Real(x), b.Unary("negate", b.Imag(x)));
  return Delegate(c, "dot", c.outputs, {TensorArg(conj), a.at(1)});
}

// renorm(self, p, dim, maxnorm): each slice along dim whose p-norm (of the
// moduli) exceeds maxnorm is scaled by maxnorm / (norm + 1e-7).
std::vector<Value> ComplexRenorm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  Value x = b.Convert(a.at(0).tensor, out.dtype);
  if (x.rank() < 2) throw Unsupported("renorm of a tensor with fewer than 2 dims");
  int64_t dim = WrapDim(a.at(2).i, x.rank());
  ElementType pt = hlo::RealPart(out.dtype);
  Arg dims, keep;
  dims.kind = K::IntList;
  keep.kind = K::Bool;
  keep.i = 1;
  std::vector<int64_t> kept(x.rank(), 1);
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim) dims.ints.push_back(d);
  kept[dim] = x.shape()[dim];
  Value norm = Delegate(c, "linalg_vector_norm", {TensorType{pt, kept}},
                        {TensorArg(complex_parts::AbsC99(b, x)), a.at(1), dims, keep, Arg{}})[0];
  Value maxnorm = As(b, a.at(3), pt, norm.shape());
  Value scale = b.Binary("divide", maxnorm, b.Binary("add", norm, b.Splat(pt, 1e-7, norm.shape())));
  scale = b.Select(b.Compare("GT", norm, maxnorm), scale, b.Splat(pt, 1, norm.shape()));
  scale = b.BroadcastTo(scale, x.shape());
  return One(b.Binary("multiply", x, b.Complex(scale, b.Splat(pt, 0, x.shape()))));
}

const bool registered = [] {
  RegisterComplex("var.correction", ComplexVar(false, false));
  RegisterComplex("std.correction", ComplexVar(true, false));
  RegisterComplex("var_mean.correction", ComplexVar(false, true));
  RegisterComplex("std_mean.correction", ComplexVar(true, true));
  RegisterComplex("logsumexp", ComplexLogSumExp);
  for (const char* n : {"norm.Scalar", "norm.ScalarOpt_dim", "norm.ScalarOpt_dtype",
                        "norm.ScalarOpt_dim_dtype"})
    RegisterComplex(n, OfModuli(n));
  RegisterComplex("vdot", ComplexVdot);
  RegisterComplex("renorm", ComplexRenorm);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
