// Advanced indexing rules: _unsafe_index (the int-index core of
// x[idx1, :, idx2]; index.Tensor itself is an explicit kernel in
// aten/data_dependent.cpp that turns bool masks into int indices first),
// index_put (int indices and bool masks, accumulate or not; index_put_ and
// x[...] = v derive from it), index_copy, masked_scatter and nonzero_static
// (embedding_dense_backward is in embedding.cpp). Every gathered or scattered index goes through
// CheckedIndex: out-of-range indices raise IndexError, negative ones wrap
// (like CPU) where PyTorch allows them.
//
// Bool masks in index_put stay static: the k-th true element takes the k-th
// row of `values`, found by an exclusive prefix count of the mask, so
// x[mask] = v needs no host sync.
#include <algorithm>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

using K = Arg::Kind;
using E = ElementType;

// Inclusive prefix sum along dim 0 of a 1-D value (Hillis-Steele).
Value CumSum1d(Builder& b, Value x) {
  int64_t n = x.shape()[0];
  Value zero = b.ConstantInt(x.dtype(), 0);
  for (int64_t k = 1; k < n; k *= 2) {
    Value shifted = b.Slice(b.Pad(x, zero, {k}, {0}, {0}), {0}, {n}, {1});
    x = b.Binary("add", x, shifted);
  }
  return x;
}

Value SumAll(Builder& b, Value x) {
  return b.Reduce(x, b.ConstantInt(x.dtype(), 0), Range(x.rank()), "add");
}

std::string Combiner(bool accumulate, ElementType t) {
  if (!accumulate) return "assign";
  return t == E::Bool ? "or" : "add";
}

// The index tensors of an index / index_put call, broadcast together.
struct Indexing {
  std::vector<int64_t> dims;        // indexed dims of self, in order
  std::vector<Value> index;         // checked i64 indices, broadcast to `batch`
  std::vector<int64_t> batch;       // broadcast shape of the index tensors
  bool adjacent = true;             // indexed dims consecutive: result keeps them in place
  std::vector<int64_t> rest;        // the other dims of self, in order
};

Indexing PrepareIndices(Context& c, Value self, const std::vector<Value>& indices,
                        const std::string& what) {
  Indexing ix;
  if (static_cast<int64_t>(indices.size()) > self.rank())
    throw std::out_of_range("too many indices for tensor of dimension " +
                            std::to_string(self.rank()) + " (got " +
                            std::to_string(indices.size()) + ")");
  for (size_t d = 0; d < indices.size(); ++d) {
    if (!indices[d].valid()) continue;
    if (indices[d].dtype() == E::Bool || indices[d].dtype() == E::U8)
      throw Unsupported(what + ": bool / uint8 mask indices here");
    if (!hlo::IsInteger(indices[d].dtype()))
      throw std::out_of_range("tensors used as indices must be long, int, byte or bool tensors");
    ix.dims.push_back(static_cast<int64_t>(d));
    ix.batch = BroadcastShapes(ix.batch, indices[d].shape());
  }
  for (size_t k = 1; k < ix.dims.size(); ++k) ix.adjacent &= ix.dims[k] == ix.dims[k - 1] + 1;
  for (int64_t d = 0; d < self.rank(); ++d)
    if (std::find(ix.dims.begin(), ix.dims.end(), d) == ix.dims.end()) ix.rest.push_back(d);
  for (int64_t d : ix.dims) {
    Value i = CheckedIndexInDim(c, indices[d], self, d, true, what);
    ix.index.push_back(c.b.BroadcastTo(i, ix.batch));
  }
  return ix;
}

// self transposed so that the indexed dims come first.
Value IndexedFirst(Builder& b, Value self, const Indexing& ix) {
  std::vector<int64_t> perm = ix.dims;
  perm.insert(perm.end(), ix.rest.begin(), ix.rest.end());
  return b.Transpose(self, perm);
}

// [batch..., n_indexed] i64 coordinates.
Value StackedIndices(Builder& b, const Indexing& ix) {
  std::vector<int64_t> col = ix.batch;
  col.push_back(1);
  std::vector<Value> cols;
  for (const Value& v : ix.index) cols.push_back(b.Reshape(v, col));
  return b.Concatenate(cols, static_cast<int64_t>(ix.batch.size()));
}

// Permutation from (batch..., rest...) order to PyTorch's result order: with
// adjacent indexed dims the batch dims replace them in place.
std::vector<int64_t> ResultPerm(const Indexing& ix) {
  int64_t nb = static_cast<int64_t>(ix.batch.size());
  int64_t nr = static_cast<int64_t>(ix.rest.size());
  std::vector<int64_t> perm;
  if (!ix.adjacent || ix.dims.empty()) return Range(nb + nr);
  int64_t before = ix.dims.front();  // rest dims before the indexed block
  for (int64_t i = 0; i < before; ++i) perm.push_back(nb + i);
  for (int64_t i = 0; i < nb; ++i) perm.push_back(i);
  for (int64_t i = before; i < nr; ++i) perm.push_back(nb + i);
  return perm;
}

std::vector<int64_t> Inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return inv;
}

// _unsafe_index.Tensor(self, Tensor?[] indices): x[i0, i1, ...] with int
// index tensors (None = full slice).
std::vector<Value> Index(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value self = a[0].tensor;
  Indexing ix = PrepareIndices(c, self, a[1].tensors, "index");
  if (ix.dims.empty()) return One(b.Reshape(b.Convert(self, out.dtype), out.shape));
  if (out.numel() == 0) return One(Zeros(b, out));
  Value g = b.Gather(IndexedFirst(b, self, ix), StackedIndices(b, ix), Range(ix.dims.size()));
  g = b.Transpose(g, ResultPerm(ix));
  return One(b.Reshape(b.Convert(g, out.dtype), out.shape));
}

// index_put with int indices: scatter rows of the values (broadcast to the
// indexing result) into self.
Value IndexPutInt(Context& c, Value self, const std::vector<Value>& indices, Value values,
                  bool accumulate) {
  Builder& b = c.b;
  ElementType t = accumulate ? ComputeType(self.dtype()) : self.dtype();
  Indexing ix = PrepareIndices(c, self, indices, "index_put");
  Value x = b.Convert(self, t);
  if (ix.dims.empty()) {
    Value v = As(b, values, t, x.shape());
    return accumulate ? b.Binary(t == E::Bool ? "or" : "add", x, v) : v;
  }
  // The result shape of x[indices], in PyTorch's order.
  std::vector<int64_t> natural = ix.batch;
  for (int64_t d : ix.rest) natural.push_back(self.shape()[d]);
  std::vector<int64_t> perm = ResultPerm(ix);
  std::vector<int64_t> result_shape;
  for (int64_t p : perm) result_shape.push_back(natural[p]);
  int64_t n = 1;
  for (int64_t s : ix.batch) n *= s;
  if (n == 0 || self.type.numel() == 0) return x;
  Value v = As(b, values, t, result_shape);
  v = b.Transpose(v, Inverse(perm));  // (batch..., rest...)
  std::vector<int64_t> flat{n};
  for (int64_t d : ix.rest) flat.push_back(self.shape()[d]);
  v = b.Reshape(v, flat);
  Value idx = b.Reshape(StackedIndices(b, ix), {n, static_cast<int64_t>(ix.dims.size())});
  Value xt = IndexedFirst(b, x, ix);
  Value r = b.Scatter(xt, idx, v, Range(ix.dims.size()), Combiner(accumulate, t));
  std::vector<int64_t> back = ix.dims;
  back.insert(back.end(), ix.rest.begin(), ix.rest.end());
  return b.Transpose(r, Inverse(back));
}

// index_put with one bool mask (other entries None): mask covers dims
// [p, p + k) of self. values broadcast to self[:p] + [nnz] + self[p+k:]; a
// values dim of size nnz is read through the prefix count of the mask.
Value IndexPutMask(Context& c, Value self, const std::vector<Value>& indices, size_t p,
                   Value values, bool accumulate) {
  Builder& b = c.b;
  ElementType t = accumulate ? ComputeType(self.dtype()) : self.dtype();
  Value x = b.Convert(self, t);
  Value mask = b.Convert(indices[p], E::Bool);
  int64_t k = mask.rank(), rank = self.rank();
  if (static_cast<int64_t>(p) + k > rank)
    throw std::out_of_range("too many indices for tensor of dimension " + std::to_string(rank));
  for (int64_t j = 0; j < k; ++j)
    if (mask.shape()[j] != self.shape()[p + j])
      throw std::out_of_range("The shape of the mask at index " + std::to_string(j) +
                              " does not match the shape of the indexed tensor at index " +
                              std::to_string(p + j));
  // Mask broadcast to self's shape.
  std::vector<int64_t> mask_dims;
  for (int64_t j = 0; j < k; ++j) mask_dims.push_back(static_cast<int64_t>(p) + j);
  Value m = b.BroadcastInDim(mask, x.shape(), mask_dims);
  // values aligned to the result rank: self[:p] + [nnz] + self[p+k:].
  int64_t rrank = rank - k + 1;
  Value v = b.Convert(values, t);
  if (v.rank() > rrank) {
    // Leading size-1 dims only (PyTorch allows them).
    std::vector<int64_t> s(v.shape().end() - rrank, v.shape().end());
    v = b.Reshape(v, s);
  }
  std::vector<int64_t> vshape(rrank - v.rank(), 1);
  vshape.insert(vshape.end(), v.shape().begin(), v.shape().end());
  v = b.Reshape(v, vshape);
  Value full;  // values at every position of self
  if (vshape[p] == 1) {
    // Broadcast along the masked positions.
    std::vector<int64_t> squeezed, dims;
    for (int64_t d = 0; d < rrank; ++d) {
      if (d == static_cast<int64_t>(p)) continue;
      squeezed.push_back(vshape[d]);
      dims.push_back(d < static_cast<int64_t>(p) ? d : d + k - 1);
    }
    Value vs = b.Reshape(v, squeezed);
    // Size-1 dims broadcast: drop them from the mapping.
    std::vector<int64_t> keep_dims;
    std::vector<int64_t> keep_shape;
    for (size_t i = 0; i < dims.size(); ++i)
      if (squeezed[i] != 1) {
        keep_dims.push_back(dims[i]);
        keep_shape.push_back(squeezed[i]);
      }
    full = b.BroadcastInDim(b.Reshape(vs, keep_shape), x.shape(), keep_dims);
  } else {
    int64_t nnz = vshape[p];
    int64_t mn = mask.type.numel();
    Value flat = b.Convert(b.Reshape(mask, {mn}), E::I64);
    Value count = SumAll(b, flat);
    c.Require(b.Compare("EQ", count, b.ConstantInt(E::I64, nnz)),
              "index_put: shape mismatch: value tensor cannot be broadcast to the number of "
              "true elements of the mask (" + std::to_string(nnz) + ")");
    // Rank of each true element among the true elements; 0 elsewhere.
    Value rank_k = b.Binary("subtract", CumSum1d(b, flat), b.Splat(E::I64, 1, {mn}));
    rank_k = b.Select(b.Compare("GT", flat, b.Splat(E::I64, 0, {mn})), rank_k,
                      b.Splat(E::I64, 0, {mn}));
    rank_k = b.Clamp(b.ConstantInt(E::I64, 0), rank_k, b.ConstantInt(E::I64, nnz - 1));
    // Broadcast v's other dims to self's, then gather along the nnz dim.
    std::vector<int64_t> vfull;
    for (int64_t d = 0; d < rrank; ++d)
      vfull.push_back(d == static_cast<int64_t>(p)
                          ? nnz
                          : x.shape()[d < static_cast<int64_t>(p) ? d : d + k - 1]);
    v = b.BroadcastTo(v, vfull);
    // Move the nnz dim first, gather rows, move the mask dims back.
    std::vector<int64_t> perm{static_cast<int64_t>(p)};
    for (int64_t d = 0; d < rrank; ++d)
      if (d != static_cast<int64_t>(p)) perm.push_back(d);
    Value vt = b.Transpose(v, perm);
    std::vector<int64_t> ishape = mask.shape();
    ishape.push_back(1);
    Value g = b.Gather(vt, b.Reshape(rank_k, ishape), {0});  // mask.shape + others
    // g dims: [mask dims (k)] + [self dims before p] + [self dims after p+k]
    std::vector<int64_t> gperm;
    for (int64_t d = 0; d < rank; ++d) {
      if (d < static_cast<int64_t>(p)) gperm.push_back(k + d);
      else if (d < static_cast<int64_t>(p) + k) gperm.push_back(d - static_cast<int64_t>(p));
      else gperm.push_back(d);
    }
    full = b.Transpose(g, gperm);
  }
  if (accumulate) {
    Value zero = b.Splat(t, 0, x.shape());
    return b.Binary(t == E::Bool ? "or" : "add", x, b.Select(m, full, zero));
  }
  return b.Select(m, full, x);
}

// index_put(self, Tensor?[] indices, values, accumulate).
std::vector<Value> IndexPut(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value self = a[0].tensor;
  const std::vector<Value>& indices = a[1].tensors;
  bool accumulate = a.size() > 3 && a[3].i != 0;
  int masks = 0, ints = 0;
  size_t mask_pos = 0;
  for (size_t d = 0; d < indices.size(); ++d) {
    if (!indices[d].valid()) continue;
    if (indices[d].dtype() == E::Bool || indices[d].dtype() == E::U8) {
      ++masks;
      mask_pos = d;
    } else {
      ++ints;
    }
  }
  Value r;
  if (masks == 0) {
    r = IndexPutInt(c, self, indices, a[2].tensor, accumulate);
  } else if (masks == 1 && ints == 0 && indices[mask_pos].rank() > 0) {
    r = IndexPutMask(c, self, indices, mask_pos, a[2].tensor, accumulate);
  } else {
    throw Unsupported("index_put: bool masks mixed with other index tensors");
  }
  return One(b.Reshape(b.Convert(r, out.dtype), out.shape));
}

// masked_scatter(self, mask, source): the k-th true position of the
// (broadcast) mask takes source.flatten()[k].
std::vector<Value> MaskedScatter(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value x = As(b, a[0], out.dtype, out.shape);
  Value m = As(b, a[1], E::Bool, out.shape);
  int64_t n = out.numel();
  if (n == 0) return One(x);
  Value src = b.Convert(a[2].tensor, out.dtype);
  int64_t sn = src.type.numel();
  Value flat = b.Convert(b.Reshape(m, {n}), E::I64);
  Value count = SumAll(b, flat);
  c.Require(b.Compare("LE", count, b.ConstantInt(E::I64, sn)),
            "masked_scatter: Number of elements of source < number of ones in mask");
  if (sn == 0) return One(x);
  Value rank_k = b.Binary("subtract", CumSum1d(b, flat), b.Splat(E::I64, 1, {n}));
  rank_k = b.Clamp(b.ConstantInt(E::I64, 0), rank_k, b.ConstantInt(E::I64, sn - 1));
  Value g = b.Gather(b.Reshape(src, {sn}), b.Reshape(rank_k, {n, 1}), {0});
  return One(b.Select(m, b.Reshape(g, out.shape), x));
}

// `src` with its bounded dynamic dims other than `dim` made static at their
// bounds. XLA's padder scatters an update whose window dims are dynamic only
// when their runtime size is the very value the operand's dim was set to;
// the module gives each input its own size parameter. The padding rows of
// the update land on the operand's padding rows (the dims' buckets agree).
Value StaticWindow(Builder& b, Value src, int64_t dim) {
  for (int64_t d = 0; d < static_cast<int64_t>(src.type.dynamic.size()); ++d)
    if (d != dim && src.type.dynamic[d]) src = b.SetDimensionSize(src, b.ConstantInt(E::I32, src.shape()[d]), d, true);
  return src;
}

// index_copy(self, dim, index, source): out.select(dim, index[i]) =
// source.select(dim, i).
std::vector<Value> IndexCopy(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value x = AtLeast1d(b, b.Convert(a[0].tensor, out.dtype));
  Value idx = a[2].tensor;
  int64_t n = idx.type.numel();
  if (n == 0 || out.numel() == 0) return One(b.Reshape(x, out.shape));
  int64_t dim = WrapDim(a[1].i, x.rank());
  idx = CheckedIndexInDim(c, idx, x, dim, false, "index_copy");
  Value src = b.Convert(StaticWindow(b, a[3].tensor, dim), out.dtype);
  std::vector<int64_t> src_shape = x.shape();
  src_shape[dim] = n;
  src = b.Reshape(src, src_shape);
  std::vector<int64_t> perm{dim};
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) perm.push_back(i);
  Value u = b.Transpose(src, perm);
  Value r = b.Scatter(x, b.Reshape(idx, {n, 1}), u, {dim}, "assign");
  return One(b.Reshape(r, out.shape));
}

// nonzero_static(self, size, fill_value): the coordinates of the first
// `size` nonzero elements in row-major order, padded with fill_value.
std::vector<Value> NonzeroStatic(Context& c, const std::vector<Arg>& a) {
  const TensorType& out = Out(c);
  Builder& b = c.b;
  Value x = a[0].tensor;
  int64_t size = out.shape.at(0), rank = x.rank();
  int64_t fill = a.size() > 2 && a[2].kind == K::Int ? a[2].i : -1;
  if (out.numel() == 0) return One(Zeros(b, out));
  int64_t n = x.type.numel();
  if (n == 0) return One(b.Splat(E::I64, static_cast<double>(fill), out.shape));
  Value nz = b.Convert(b.Reshape(x, {n}), E::Bool);
  Value flat = b.Convert(nz, E::I64);
  Value pos = b.Binary("subtract", CumSum1d(b, flat), b.Splat(E::I64, 1, {n}));
  Value slot = b.Select(
      b.Binary("and", nz, b.Compare("LT", pos, b.Splat(E::I64, static_cast<double>(size), {n}))),
      pos, b.Splat(E::I64, static_cast<double>(size), {n}));
  Value where = b.Scatter(b.Splat(E::I64, 0, {size + 1}), b.Reshape(slot, {n, 1}),
                          b.Iota(TensorType{E::I64, {n}}, 0), {0}, "assign");
  where = b.Slice(where, {0}, {size}, {1});
  Value count = SumAll(b, flat);
  Value valid = b.Compare("LT", b.Iota(TensorType{E::I64, {size}}, 0),
                          b.BroadcastInDim(count, {size}, {}));
  std::vector<Value> cols;
  int64_t stride = n;
  for (int64_t d = 0; d < rank; ++d) {
    stride /= x.shape()[d];
    Value coord = b.Binary("divide", where, b.Splat(E::I64, static_cast<double>(stride), {size}));
    coord = b.Binary("remainder", coord,
                     b.Splat(E::I64, static_cast<double>(x.shape()[d]), {size}));
    coord = b.Select(valid, coord, b.Splat(E::I64, static_cast<double>(fill), {size}));
    cols.push_back(b.Reshape(coord, {size, 1}));
  }
  return One(b.Reshape(b.Convert(b.Concatenate(cols, 1), out.dtype), out.shape));
}

// Bounded dynamic shapes: integer indices gather and scatter at coordinates,
// which a padded dim keeps (its real elements first), so self, the indices
// and the values may all be dynamic; each index is checked against (and a
// negative one wraps by) its dim's real size. A bool mask's result length
// counts its true elements: exact shapes.
void IntegerIndicesOnly(const std::vector<Arg>& a, StaticDims& s) {
  for (const Value& i : a.at(1).tensors)
    if (i.dtype() == E::Bool || i.dtype() == E::U8) s.Exact("bool mask indices");
}

const bool registered = [] {
  // A sequence classifier's last-token logits (x[arange(b), lengths]).
  Register("_unsafe_index.Tensor", Index).Dynamic(IntegerIndicesOnly);
  Register("index_put", IndexPut).Dynamic(IntegerIndicesOnly);
  Register("_unsafe_index_put", IndexPut).Dynamic(IntegerIndicesOnly);
  // index backward and index_put_ on some paths: the in-place form derives.
  Register("_index_put_impl", IndexPut).Dynamic(IntegerIndicesOnly);
  // Bounded dynamic shapes (a static KV cache's update, at any batch size
  // and prompt length): the index check reads the destination's real size.
  Register("index_copy", IndexCopy).Dynamic();
  Register("masked_scatter", MaskedScatter);
  Register("nonzero_static", NonzeroStatic);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
