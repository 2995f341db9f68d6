// torch.norm's ATen overloads (norm.Scalar, norm.ScalarOpt_dim, ... : what
// torch.dist, pairwise_distance and the triplet losses call) and renorm, as
// linalg_vector_norm (its rule, with every special ord: inf, -inf, 0, 1, 2, p).
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

// linalg_vector_norm(self, ord, dim?, keepdim, dtype?) under its own output type.
Value VectorNorm(Context& c, const TensorType& out, const std::vector<Arg>& args) {
  Context sub{c.b};
  sub.outputs = {out};
  sub.fp32_highest = c.fp32_highest;
  sub.op = c.op;
  sub.default_float = c.default_float;
  std::vector<Value> r = Find("linalg_vector_norm")->rule(sub, args);
  for (auto& check : sub.checks) c.checks.push_back(std::move(check));
  return r.at(0);
}

Arg Ord(const Arg& p) {
  if (p.kind != K::None) return p;
  Arg two;
  two.kind = K::Double;
  two.d = 2;
  return two;
}

Arg Flag(bool v) {
  Arg a;
  a.kind = K::Bool;
  a.i = v;
  return a;
}

// norm.<overload>(self, p?, [dim, keepdim], [dtype]): `dim_at` is where dim is (0: none).
Rule NormRule(size_t dim_at, size_t dtype_at) {
  return [dim_at, dtype_at](Context& c, const std::vector<Arg>& a) {
    Arg dims, keepdim = Flag(false), dtype;
    if (dim_at) {
      dims = a.at(dim_at);
      keepdim = a.at(dim_at + 1);
    }
    if (dtype_at) dtype = a.at(dtype_at);
    return One(VectorNorm(c, Out(c), {a.at(0), Ord(a.at(1)), dims, keepdim, dtype}));
  };
}

// renorm(self, p, dim, maxnorm): each slice along `dim` whose p-norm exceeds
// maxnorm is scaled by maxnorm / (norm + 1e-7), in the compute type.
std::vector<Value> Renorm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = Out(c);
  ElementType ct = ComputeType(out.dtype);
  Value x = b.Convert(a.at(0).tensor, ct);
  if (x.rank() < 2) throw Unsupported("renorm of a tensor with fewer than 2 dims");
  int64_t dim = WrapDim(a.at(2).i, x.rank());
  Arg self, dims;
  self.kind = K::Tensor;
  self.tensor = x;
  dims.kind = K::IntList;
  std::vector<int64_t> kept(x.shape().size(), 1);
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim) dims.ints.push_back(d);
  kept[dim] = x.shape()[dim];
  Value norm = VectorNorm(c, TensorType{ct, kept}, {self, a.at(1), dims, Flag(true), Arg{}});
  Value maxnorm = As(b, a.at(3), ct, norm.shape());
  Value scale = b.Binary("divide", maxnorm, b.Binary("add", norm, b.Splat(ct, 1e-7, norm.shape())));
  scale = b.Select(b.Compare("GT", norm, maxnorm), scale, b.Splat(ct, 1, norm.shape()));
  return One(b.Convert(b.Binary("multiply", x, b.BroadcastTo(scale, x.shape())), out.dtype));
}

const bool registered = [] {
  Register("norm.Scalar", NormRule(0, 0));
  Register("norm.ScalarOpt_dim", NormRule(2, 0));
  Register("norm.ScalarOpt_dtype", NormRule(0, 2));
  Register("norm.ScalarOpt_dim_dtype", NormRule(2, 4));
  Register("renorm", Renorm);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
