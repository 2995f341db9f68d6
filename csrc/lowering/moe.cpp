// _grouped_mm(mat_a, mat_b, offs?, bias?, out_dtype?): the grouped GEMM of
// mixture-of-experts layers. `offs` holds the cumulative end offsets of the
// groups; they are runtime data, so the module has static shapes: every
// group's product is computed and a mask built from iota comparisons with
// offs selects, for each row (or column, or contraction index), the group it
// belongs to. Exactly one group contributes to each output element, so the
// masked sum is exact. Rows past the last offset are zero (the CPU kernel
// leaves them uninitialized). Costs G times the FLOPs of one matmul:
// correctness first.
#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;

// mask[i, g] = offs[g-1] <= i < offs[g] (offs[-1] = 0), shape [n, G].
Value GroupMask(Builder& b, Value offs, int64_t n) {
  int64_t groups = offs.shape().at(0);
  Value end = b.Convert(offs, ElementType::I64);
  Value start = end;
  if (groups > 0) {
    Value zero = b.Reshape(b.ConstantInt(ElementType::I64, 0), {1});
    start = b.Concatenate({zero, b.Slice(end, {0}, {groups - 1}, {1})}, 0);
  }
  std::vector<int64_t> shape{n, groups};
  Value i = b.Iota({ElementType::I64, shape}, 0);
  Value lo = b.BroadcastInDim(start, shape, {1});
  Value hi = b.BroadcastInDim(end, shape, {1});
  return b.Binary("and", b.Compare("GE", i, lo), b.Compare("LT", i, hi));
}

std::vector<Value> GroupedMm(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  const TensorType& out = c.outputs.at(0);
  if (a.at(0).kind != K::Tensor || a.at(1).kind != K::Tensor)
    throw std::logic_error("_grouped_mm: expected tensors");
  if (a.size() > 3 && !a[3].is_none()) throw Unsupported("_grouped_mm: bias");
  Value mat_a = a[0].tensor, mat_b = a[1].tensor;
  bool has_offs = a.size() > 2 && a[2].kind == K::Tensor;
  ElementType in = PromoteTypes(mat_a.dtype(), mat_b.dtype());
  if (!hlo::IsFloat(in)) throw Unsupported("_grouped_mm of non-float tensors");
  mat_a = b.Convert(mat_a, in);
  mat_b = b.Convert(mat_b, in);
  ElementType acc = ComputeType(in);
  bool highest = in == ElementType::F64 || (in == ElementType::F32 && c.fp32_highest);
  auto dot = [&](Value l, Value r, std::vector<int64_t> lb, std::vector<int64_t> rb,
                 std::vector<int64_t> lc, std::vector<int64_t> rc) {
    return b.DotGeneral(l, r, lb, rb, lc, rc, acc, highest);
  };
  auto finish = [&](Value v) {
    return std::vector<Value>{b.Reshape(b.Convert(v, out.dtype), out.shape)};
  };
  int64_t ra = mat_a.rank(), rb = mat_b.rank();
  if (ra == 3 && rb == 3) {
    if (has_offs) throw std::invalid_argument("_grouped_mm: offs given for 3d x 3d");
    return finish(dot(mat_a, mat_b, {0}, {0}, {2}, {1}));
  }
  if (!has_offs) throw std::invalid_argument("_grouped_mm: offs is needed for 2d operands");
  Value offs = a[2].tensor;
  if (offs.rank() != 1) throw std::invalid_argument("_grouped_mm: offs has to be 1D");
  int64_t groups = offs.shape()[0];
  if (ra == 2 && rb == 3) {
    // Rows of a in group g use b[g]: [M, K] x [G, K, N] -> [M, N].
    int64_t m = mat_a.shape()[0], n = mat_b.shape()[2];
    Value y = dot(mat_a, mat_b, {}, {}, {1}, {1});  // [M, G, N]
    std::vector<int64_t> shape{m, groups, n};
    Value mask = b.BroadcastInDim(GroupMask(b, offs, m), shape, {0, 1});
    Value picked = b.Select(mask, y, b.Splat(acc, 0, shape));
    return finish(b.Reduce(picked, b.Constant(acc, 0), {1}, "add"));
  }
  if (ra == 3 && rb == 2) {
    // Columns of b in group g use a[g]: [G, M, K] x [K, N] -> [M, N].
    int64_t m = mat_a.shape()[1], n = mat_b.shape()[1];
    Value y = dot(mat_a, mat_b, {}, {}, {2}, {0});  // [G, M, N]
    std::vector<int64_t> shape{groups, m, n};
    Value mask = b.BroadcastInDim(GroupMask(b, offs, n), shape, {2, 0});
    Value picked = b.Select(mask, y, b.Splat(acc, 0, shape));
    return finish(b.Reduce(picked, b.Constant(acc, 0), {0}, "add"));
  }
  if (ra == 2 && rb == 2) {
    // Contraction indices in group g form product g: [M, K] x [K, N] -> [G, M, N].
    int64_t m = mat_a.shape()[0], k = mat_a.shape()[1];
    std::vector<int64_t> shape{groups, m, k};
    Value mask = b.BroadcastInDim(GroupMask(b, offs, k), shape, {2, 0});
    Value a3 = b.BroadcastInDim(mat_a, shape, {1, 2});
    Value masked = b.Select(mask, a3, b.Splat(in, 0, shape));
    return finish(dot(masked, mat_b, {}, {}, {2}, {0}));
  }
  throw std::invalid_argument("_grouped_mm: operands must be 2D or 3D");
}

void Check(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// PyTorch's meta kernel takes bf16 operands only, while its CPU kernel and
// this rule also take f32 and f16: the output type, with the CPU kernel's
// checks.
std::vector<TensorType> GroupedMmOutputTypes(const std::vector<Arg>& a) {
  if (a.size() < 2 || a[0].kind != K::Tensor || a[1].kind != K::Tensor)
    throw std::logic_error("_grouped_mm: expected tensors");
  const TensorType& x = a[0].tensor.type;
  const TensorType& w = a[1].tensor.type;
  Check(x.dtype == ElementType::F32 || x.dtype == ElementType::F16 || x.dtype == ElementType::BF16,
        std::string("Expected mat_a to be Float32, BFloat16 or Float16 matrix, got ") +
            hlo::Name(x.dtype));
  Check(x.dtype == w.dtype, "expected mat_a and mat_b to have the same dtype");
  Check((x.rank() == 2 || x.rank() == 3) && (w.rank() == 2 || w.rank() == 3),
        "Multiplicands must be 2D or 3D but got mat_a.dim()=" + std::to_string(x.rank()) +
            " and mat_b.dim()=" + std::to_string(w.rank()));
  Check(x.shape.back() == w.shape[w.rank() - 2], "contraction dimension of mat_a and mat_b must match");
  bool has_offs = a.size() > 2 && a[2].kind == K::Tensor;
  if (x.rank() == 2 || w.rank() == 2) {
    Check(has_offs, "Offsets tensor not provided, but is needed for 2D multiplicand layouts.");
    Check(a[2].tensor.rank() == 1, "Offsets tensor must be 1D");
    Check(a[2].tensor.dtype() == ElementType::I32, "Offsets have to be int32");
  } else {
    Check(!has_offs, "Offsets tensor provided, but is not needed for 3D/3D multiplicand layouts.");
    Check(x.shape[0] == w.shape[0], "batch sizes of mat_a and mat_b must match");
  }
  Check(a.size() <= 3 || a[3].is_none(), "Bias tensor provided, but it is not supported yet.");
  Check(a.size() <= 4 || a[4].is_none() || a[4].dtype == x.dtype,
        "Grouped gemm output dtype must match `mat_a` dtype");
  std::vector<int64_t> sizes;
  if (x.rank() == 2 && w.rank() == 3) sizes = {x.shape[0], w.shape[2]};
  else if (x.rank() == 3 && w.rank() == 2) sizes = {x.shape[1], w.shape[1]};
  else if (x.rank() == 2) sizes = {a[2].tensor.shape()[0], x.shape[0], w.shape[1]};
  else sizes = {x.shape[0], x.shape[1], w.shape[2]};
  return {TensorType{x.dtype, sizes}};
}

// Bounded dynamic in its token dims (Mixtral's routed rows at a new prompt
// length): the group ends in offs stay static in number; rows past the last
// end belong to no group, so the padding adds nothing. 2d x 3d: its rows are
// independent.
const bool registered = [] {
  RuleEntry& e = Register("_grouped_mm", GroupedMm).Dynamic([](const std::vector<Arg>&, StaticDims& s) {
    if (s.Rank(2) == 1) s.Dim(2, 0);
    s.Because("the number of groups");
  });
  e.output_types = GroupedMmOutputTypes;
  e.dynamic.independent_dims = [](const std::vector<Arg>&, StaticDims& s) {
    if (s.Rank(0) == 2 && s.Rank(1) == 3) s.Dim(0, 0);
  };
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
