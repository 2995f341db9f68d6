// Helpers shared by the linear-algebra rule files (linalg_lu.cpp,
// linalg_decompositions.cpp): batched matrices [..., rows, cols], masks,
// matrix products, loops. No rule lives here.
#pragma once

#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering::linalg {

using E = ElementType;

// f32 or f64 (what XLA's decompositions support), else Unsupported.
ElementType LinalgType(ElementType t, const std::string& op);
// [..., r, c] -> the batch dims [...].
std::vector<int64_t> BatchOf(const std::vector<int64_t>& shape);
// batch + extra dims.
std::vector<int64_t> With(std::vector<int64_t> batch, std::initializer_list<int64_t> extra);
// 0..n-1 without `skip`.
std::vector<int64_t> Without(int64_t rank, int64_t skip);
// 0..n-1.
std::vector<int64_t> Iota(int64_t n);
// Swaps the last two dims.
Value MT(Builder& b, Value x);
// Batched x @ y over the last two dims (same batch), highest precision.
Value MatMul(Builder& b, Value x, Value y);
// Identity matrices [..., n, n].
Value Eye(Builder& b, ElementType t, const std::vector<int64_t>& batch, int64_t n);
// Mask of x's shape: row - col compared with `offset` ("GE" with 0: lower
// triangle incl. the diagonal; "LE": upper).
Value TriangleMask(Builder& b, const std::vector<int64_t>& shape, const std::string& cmp,
                   int64_t offset = 0);
// x with the elements outside the mask set to zero.
Value Masked(Builder& b, Value mask, Value x);
// The main diagonal [..., min(r, c)].
Value Diagonal(Builder& b, Value x);
// Sum over `dim` of x where mask holds (exact: other terms are zeros).
Value MaskedSum(Builder& b, Value mask, Value x, int64_t dim);
// x[..., i] along the last dim for a rank-0 i64 `i`, as a [...] value.
Value TakeLast(Builder& b, Value x, Value i);
// Reduces all dims of a bool tensor with "and".
Value AllTrue(Builder& b, Value x);
// for (i = start; i < stop; ++i) values = body(i, values); i is a rank-0 i64.
std::vector<Value> ForLoop(
    Builder& b, int64_t start, int64_t stop, const std::vector<Value>& init,
    const std::function<std::vector<Value>(Value, const std::vector<Value>&)>& body);
// A rank-0 i64 broadcast to `shape`.
Value Bcast(Builder& b, Value scalar, const std::vector<int64_t>& shape);

// LU with partial pivoting (LAPACK getrf) of [..., m, n]: packed factors,
// 1-based int32 pivots [..., min(m, n)], info [...] (first zero pivot, 1-based).
struct LuResult {
  Value lu, pivots, info;
};
LuResult LuFactor(Builder& b, Value a);
// Applies getrf's row swaps (pivots [..., k], 1-based) to the rows of x
// [..., m, c] in order (P x), or undoes them (reverse: P^T x).
Value ApplySwaps(Builder& b, Value x, Value pivots, bool reverse);
// Solves A x = rhs (or A^T x = rhs) from A's packed LU (square).
Value LuSolve(Builder& b, Value lu, Value pivots, Value rhs, bool adjoint);

}  // namespace torch_tpu::lowering::linalg
