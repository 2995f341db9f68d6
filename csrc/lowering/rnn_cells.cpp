// The fused RNN cells that ATen's LSTM/GRU loops call on CUDA, XPU and
// PrivateUse1 devices (aten/src/ATen/native/RNN.cpp), and their backward
// ops. PyTorch implements them only for CUDA, so the CPU fallback cannot run
// them: without these rules nn.LSTM / nn.GRU fail on tpu.
//
// - _thnn_fused_lstm_cell(igates, hgates, cx, b_ih?, b_hh?) -> (hy, cy, ws):
//   gates = igates + hgates (+ biases), chunked i, f, g, o along the last dim;
//   cy = sigmoid(f) * cx + sigmoid(i) * tanh(g); hy = sigmoid(o) * tanh(cy).
//   The workspace holds the activated gates [i, f, g, o] (CUDA's layout).
// - _thnn_fused_lstm_cell_backward_impl(grad_hy?, grad_cy?, cx, cy, ws,
//   has_bias) -> (grad_gates, grad_cx, grad_bias?).
// - _thnn_fused_gru_cell(igates, hgates, hx, b_ih?, b_hh?) -> (hy, ws):
//   r = sigmoid(ir + hr), z = sigmoid(iz + hz), n = tanh(in + r * hn),
//   hy = n + z * (hx - n); the workspace is [r, z, n, hx, hn] (CUDA's).
// - _thnn_fused_gru_cell_backward(grad_hy, ws, has_bias) -> (grad_igates,
//   grad_hgates, grad_hx, grad_b_ih?, grad_b_hh?).
// Arithmetic runs in the compute type (f32 for 16-bit floats), as CUDA's
// kernels do in their accumulate type. The GRU ops' meta kernels are in
// csrc/aten/rnn_meta.cpp (PyTorch has none).
#include <string>
#include <vector>

#include "lowering/lowering.h"

namespace torch_tpu::lowering {
namespace {

// Columns [i*h, (i+1)*h) of the last dim.
Value Chunk(Builder& b, Value x, int64_t i, int64_t h) {
  int64_t r = x.rank();
  std::vector<int64_t> start(r, 0), limit = x.shape(), strides(r, 1);
  start[r - 1] = i * h;
  limit[r - 1] = (i + 1) * h;
  return b.Slice(x, start, limit, strides);
}

Value Mul(Builder& b, Value x, Value y) { return b.Binary("multiply", x, y); }
Value Add(Builder& b, Value x, Value y) { return b.Binary("add", x, y); }
Value Sub(Builder& b, Value x, Value y) { return b.Binary("subtract", x, y); }
Value OneMinus(Builder& b, Value x) {
  return Sub(b, b.Splat(x.dtype(), 1, x.shape()), x);
}

// The tensor arg `i` in type `t` (broadcast along the leading dims to
// `shape` when it is a bias vector), or an invalid Value when it is None.
Value Opt(Builder& b, const std::vector<Arg>& a, size_t i, ElementType t,
          const std::vector<int64_t>& shape) {
  if (i >= a.size() || a[i].kind != Arg::Kind::Tensor) return Value();
  return As(b, a[i], t, shape);
}

ElementType CellType(const Value& x, const char* op) {
  if (!hlo::IsFloat(x.dtype())) throw Unsupported(std::string(op) + " of a non-float tensor");
  return ComputeType(x.dtype());
}

// igates + hgates + b_ih + b_hh, in `t`.
Value GateSum(Builder& b, const std::vector<Arg>& a, ElementType t) {
  const std::vector<int64_t>& shape = a.at(0).tensor.shape();
  Value g = Add(b, As(b, a[0], t, shape), As(b, a.at(1), t, shape));
  for (size_t i : {3, 4}) {
    Value bias = Opt(b, a, i, t, shape);
    if (bias.valid()) g = Add(b, g, bias);
  }
  return g;
}

std::vector<Value> LstmCell(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value cx_in = a.at(2).tensor;
  ElementType t = CellType(cx_in, "_thnn_fused_lstm_cell");
  int64_t h = cx_in.shape().back();
  Value gates = GateSum(b, a, t);
  Value i = b.Unary("logistic", Chunk(b, gates, 0, h));
  Value f = b.Unary("logistic", Chunk(b, gates, 1, h));
  Value g = b.Unary("tanh", Chunk(b, gates, 2, h));
  Value o = b.Unary("logistic", Chunk(b, gates, 3, h));
  Value cx = b.Convert(cx_in, t);
  Value cy = Add(b, Mul(b, f, cx), Mul(b, i, g));
  Value hy = Mul(b, o, b.Unary("tanh", cy));
  Value ws = b.Concatenate({i, f, g, o}, gates.rank() - 1);
  return {b.Convert(hy, Out(c, 0).dtype), b.Convert(cy, Out(c, 1).dtype),
          b.Convert(ws, Out(c, 2).dtype)};
}

// grad_gates summed over the batch (dim 0), for the bias gradients.
Value BiasGrad(Builder& b, Value grad_gates, ElementType out) {
  Value s = b.Reduce(grad_gates, b.Constant(grad_gates.dtype(), 0), {0}, "add");
  return b.Convert(s, out);
}

std::vector<Value> LstmCellBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  if (c.outputs.empty()) return {};  // no incoming gradient at all
  Value cx_in = a.at(2).tensor;
  ElementType t = CellType(cx_in, "_thnn_fused_lstm_cell_backward_impl");
  const std::vector<int64_t>& shape = cx_in.shape();
  int64_t h = shape.back();
  Value cx = b.Convert(cx_in, t);
  Value cy = As(b, a.at(3), t, shape);
  Value ws = b.Convert(a.at(4).tensor, t);
  Value i = Chunk(b, ws, 0, h), f = Chunk(b, ws, 1, h);
  Value g = Chunk(b, ws, 2, h), o = Chunk(b, ws, 3, h);
  Value grad_hy = Opt(b, a, 0, t, shape);
  Value grad_cy = Opt(b, a, 1, t, shape);
  Value zeros = b.Splat(t, 0, shape);
  if (!grad_hy.valid()) grad_hy = zeros;
  if (!grad_cy.valid()) grad_cy = zeros;
  Value tanh_cy = b.Unary("tanh", cy);
  // d cy: through hy = o * tanh(cy), plus the incoming grad_cy.
  Value gcy = Add(b, Mul(b, Mul(b, grad_hy, o), OneMinus(b, Mul(b, tanh_cy, tanh_cy))), grad_cy);
  Value gi = Mul(b, Mul(b, gcy, g), Mul(b, i, OneMinus(b, i)));
  Value gf = Mul(b, Mul(b, gcy, cx), Mul(b, f, OneMinus(b, f)));
  Value gg = Mul(b, Mul(b, gcy, i), OneMinus(b, Mul(b, g, g)));
  Value go = Mul(b, Mul(b, grad_hy, tanh_cy), Mul(b, o, OneMinus(b, o)));
  Value grad_gates = b.Concatenate({gi, gf, gg, go}, ws.rank() - 1);
  std::vector<Value> out = {b.Convert(grad_gates, Out(c, 0).dtype),
                            b.Convert(Mul(b, gcy, f), Out(c, 1).dtype)};
  if (c.outputs.size() > 2) out.push_back(BiasGrad(b, grad_gates, Out(c, 2).dtype));
  return out;
}

std::vector<Value> GruCell(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value hx_in = a.at(2).tensor;
  ElementType t = CellType(hx_in, "_thnn_fused_gru_cell");
  const std::vector<int64_t>& gshape = a.at(0).tensor.shape();
  int64_t h = hx_in.shape().back();
  Value ig = As(b, a[0], t, gshape), hg = As(b, a.at(1), t, gshape);
  Value b_ih = Opt(b, a, 3, t, gshape), b_hh = Opt(b, a, 4, t, gshape);
  if (b_ih.valid()) ig = Add(b, ig, b_ih);
  if (b_hh.valid()) hg = Add(b, hg, b_hh);
  Value r = b.Unary("logistic", Add(b, Chunk(b, ig, 0, h), Chunk(b, hg, 0, h)));
  Value z = b.Unary("logistic", Add(b, Chunk(b, ig, 1, h), Chunk(b, hg, 1, h)));
  Value hn = Chunk(b, hg, 2, h);
  Value n = b.Unary("tanh", Add(b, Chunk(b, ig, 2, h), Mul(b, r, hn)));
  Value hx = b.Convert(hx_in, t);
  Value hy = Add(b, n, Mul(b, z, Sub(b, hx, n)));
  Value ws = b.Concatenate({r, z, n, hx, hn}, ig.rank() - 1);
  return {b.Convert(hy, Out(c, 0).dtype), b.Convert(ws, Out(c, 1).dtype)};
}

std::vector<Value> GruCellBackward(Context& c, const std::vector<Arg>& a) {
  Builder& b = c.b;
  Value grad_in = a.at(0).tensor;
  ElementType t = CellType(grad_in, "_thnn_fused_gru_cell_backward");
  const std::vector<int64_t>& shape = grad_in.shape();
  int64_t h = shape.back();
  Value go = b.Convert(grad_in, t);
  Value ws = b.Convert(a.at(1).tensor, t);
  Value r = Chunk(b, ws, 0, h), z = Chunk(b, ws, 1, h), n = Chunk(b, ws, 2, h);
  Value hx = Chunk(b, ws, 3, h), hn = Chunk(b, ws, 4, h);
  Value gz = Mul(b, Mul(b, go, Sub(b, hx, n)), Mul(b, z, OneMinus(b, z)));
  Value gn = Mul(b, Mul(b, go, OneMinus(b, z)), OneMinus(b, Mul(b, n, n)));
  Value ghn = Mul(b, gn, r);
  Value gr = Mul(b, Mul(b, gn, hn), Mul(b, r, OneMinus(b, r)));
  int64_t last = ws.rank() - 1;
  Value grad_ig = b.Concatenate({gr, gz, gn}, last);
  Value grad_hg = b.Concatenate({gr, gz, ghn}, last);
  std::vector<Value> out = {b.Convert(grad_ig, Out(c, 0).dtype),
                            b.Convert(grad_hg, Out(c, 1).dtype),
                            b.Convert(Mul(b, go, z), Out(c, 2).dtype)};
  if (c.outputs.size() > 3) {
    out.push_back(BiasGrad(b, grad_ig, Out(c, 3).dtype));
    out.push_back(BiasGrad(b, grad_hg, Out(c, 4).dtype));
  }
  return out;
}

const bool registered = [] {
  Register("_thnn_fused_lstm_cell", LstmCell);
  Register("_thnn_fused_lstm_cell_backward_impl", LstmCellBackward);
  Register("_thnn_fused_gru_cell", GruCell);
  Register("_thnn_fused_gru_cell_backward", GruCellBackward);
  return true;
}();

}  // namespace
}  // namespace torch_tpu::lowering
