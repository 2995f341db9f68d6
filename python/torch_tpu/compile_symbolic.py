"""Graphs with symbolic shapes (torch.compile's ``dynamic=True``, Dynamo's
automatic dynamic shapes after a recompile, ``torch._dynamo.mark_dynamic``):
one bounded-dynamic module per size bucket, not one per concrete shape.

AOTAutograd traces the graph once, symbolically. At call time each symbol
takes its value from the call's arguments (a SymInt input, or a tensor dim
that is that symbol) and its *bucket* (strict eager's, ``torch_tpu.dynamic.bucket``:
4, 8, 16, then 8 per octave: 18, 20, ..., 32, 36, ...; a value up to 16
reuses the smallest small bucket its symbol already has a module for, as
eager does, while that padding costs each tensor at most the slack,
TORCH_TPU_PADDING_SLACK_BYTES; past it a fine bucket: 1-4, then even sizes). The module of a
bucket key (one bucket per symbol) is built from the same FX graph with every
symbolic dim at its bound (the expression evaluated at the buckets) and
flagged dynamic: set_dimension_size'd to its real size, a runtime i32
parameter (graph.h), so XLA's dynamic padder masks reductions and
contractions; a new size inside a warm bucket compiles nothing. Inputs are
passed padded to their bound, dynamic outputs come back with their real
sizes in padded storages (as eager's dynamic ops leave theirs).

A graph runs exact shapes instead (one module per concrete shape, as before:
correct, not shape-polymorphic), counted in ``compile.stats()
["exact_shape_graphs"]`` with its reason in :func:`fallbacks`, when:

- a symbolic size expression is not monotone in its symbols (its value at
  the bucket would not bound every size in the bucket),
- a symbolic size is used as a value (a slice start, an index, a scalar
  operand) rather than as a size (view / expand / factory sizes, a slice end),
- an op outside :data:`PADDER_SAFE` reads or makes a value with a dynamic dim
  (the padder handles these; an op reading positions, e.g. flip or an index
  into a dynamic dim, would read the padding),
- the bounded module fails to build or compile.

A mutated graph input with dynamic dims (a static KV cache whose batch or
length is a symbol) takes its new value padded at its bound, as eager's
in-place dynamic ops leave their storages.
"""
from __future__ import annotations

from typing import Any

import sympy
import torch

from . import _C
from .compile_graph import NotBounded, _Compiled, _fallback, _lower, _unbox, _Unsupported
from .dynamic import bucket

_stats = {"bucketed_graphs": 0, "bucket_modules": 0, "exact_shape_graphs": 0, "exact_shape_modules": 0}
_FALLBACKS: dict[str, int] = {}  # reason -> graphs that ran exact shapes for it
CREATED: list = []  # the Bucketed graphs of the Dynamo graph being compiled (compile.backend)


def fallbacks() -> dict[str, int]:
    """Why symbolic graphs ran exact shapes: reason -> number of graphs."""
    return dict(_FALLBACKS)


def reset() -> None:
    for k in _stats:
        _stats[k] = 0
    _FALLBACKS.clear()


# Ops the dynamic padder handles on values with bounded dynamic dims (the
# reductions, contractions and their masks), by ATen base name. Views and
# factories whose sizes are symbolic are here too: their sizes are bounds and
# their results are set to the real sizes.
PADDER_SAFE = frozenset("""
abs neg exp exp2 log log1p log2 expm1 sqrt rsqrt sin cos tan tanh sigmoid relu gelu silu erf
remainder fmod floor_divide atan2 square sgn isnan isinf isfinite nan_to_num logical_xor mish hardswish hardsigmoid
reciprocal sign floor ceil round trunc pow leaky_relu hardtanh elu softplus clamp clamp_min
clamp_max add sub rsub mul div maximum minimum where eq ne lt le gt ge bitwise_and bitwise_or
bitwise_xor bitwise_not logical_not logical_and logical_or masked_fill _to_copy clone copy alias detach
lift_fresh_copy sum mean amax amin prod argmax argmin max min _softmax _log_softmax
_softmax_backward_data _log_softmax_backward_data mm bmm addmm matmul linear native_layer_norm
native_layer_norm_backward _fused_rms_norm _fused_rms_norm_backward cat embedding cumsum
gelu_backward silu_backward threshold_backward tanh_backward sigmoid_backward
_scaled_dot_product_efficient_attention select index_select gather index index_copy tril triu
view _unsafe_view reshape expand permute transpose t unsqueeze squeeze slice
full zeros ones empty arange scalar_tensor new_zeros new_ones new_empty new_full full_like
zeros_like ones_like empty_like
""".split())

# (op base name, argument name) whose SymInt values are sizes: evaluated at
# the bounds in a bounded module (the result is then set to its real sizes).
_SIZE_ARGS = frozenset([
    ("view", "size"), ("_unsafe_view", "size"), ("reshape", "shape"), ("expand", "size"),
    ("new_zeros", "size"), ("new_ones", "size"), ("new_empty", "size"), ("new_full", "size"),
    ("full", "size"), ("zeros", "size"), ("ones", "size"), ("empty", "size"),
    ("arange", "end"), ("slice", "end"),
])


def _expr(v: Any) -> sympy.Expr:
    return v.node.expr if isinstance(v, torch.SymInt) else sympy.Integer(int(v))


def _monotone(e: sympy.Expr) -> bool:
    """Whether `e` never decreases as its (positive) symbols grow: its value
    at the buckets then bounds its value at every size in them."""
    from torch.utils._sympy.functions import CeilToInt, FloorDiv, FloorToInt, IntTrueDiv

    if e.is_number or e.is_Symbol:
        return True
    if isinstance(e, sympy.Add):
        return all(_monotone(a) for a in e.args)
    if isinstance(e, sympy.Mul):
        nums = [a for a in e.args if a.is_number]
        return all(n >= 0 for n in nums) and all(_monotone(a) for a in e.args if not a.is_number)
    if isinstance(e, (FloorDiv, IntTrueDiv)):
        return _monotone(e.args[0]) and e.args[1].is_number and e.args[1] > 0
    if isinstance(e, (CeilToInt, FloorToInt, sympy.floor, sympy.ceiling, sympy.Max, sympy.Min)):
        return all(_monotone(a) for a in e.args)
    if isinstance(e, sympy.Pow):
        return _monotone(e.args[0]) and e.args[1].is_Integer and e.args[1] > 0
    return False


class Symbols:
    """Where each symbol of a graph is read from its call arguments."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.where: dict[sympy.Symbol, tuple[int, int | None]] = {}
        pos = 0
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt) and _expr(val).is_Symbol:
                self.where.setdefault(_expr(val), (pos, None))
            elif isinstance(val, torch.Tensor):
                for d, n in enumerate(val.shape):
                    if isinstance(n, torch.SymInt) and _expr(n).is_Symbol:
                        self.where.setdefault(_expr(n), (pos, d))
            pos += 1
        self.order = sorted(self.where, key=str)
        self.missing = sorted(str(s) for s in _free_symbols(gm) if s not in self.where)

    def values(self, args: list) -> tuple[int, ...]:
        out = []
        for s in self.order:
            pos, d = self.where[s]
            a = args[pos]
            out.append(int(a) if d is None else int(a.shape[d]))
        return tuple(out)


def _free_symbols(gm: torch.fx.GraphModule) -> set:
    syms: set = set()
    for node in gm.graph.nodes:
        for v in _vals(node.meta.get("val")):
            if isinstance(v, torch.SymInt):
                syms |= _expr(v).free_symbols
            elif isinstance(v, torch.Tensor):
                for n in v.shape:
                    if isinstance(n, torch.SymInt):
                        syms |= _expr(n).free_symbols
    return syms


def _vals(val: Any) -> list:
    if isinstance(val, (tuple, list)):
        return [v for x in val for v in _vals(x)]
    return [val]


def unbounded_reason(gm: torch.fx.GraphModule) -> str | None:
    """Why the graph cannot run bounded dynamic at any bucket, or None."""
    for node in gm.graph.nodes:
        for v in _vals(node.meta.get("val")):
            dims = [v] if isinstance(v, torch.SymInt) else list(v.shape) if isinstance(v, torch.Tensor) else []
            for n in dims:
                if isinstance(n, torch.SymInt) and not _monotone(_expr(n)):
                    return f"size {_expr(n)} is not monotone in its symbols"
    return None


class Shapes:
    """Symbolic sizes evaluated for one module: at the buckets with symbolic
    dims dynamic (`dynamic`), or at a call's exact sizes (an exact-shape
    module). Dynamic dims are numbered by expression: runtime size k."""

    def __init__(self, symbols: Symbols, values: tuple, dynamic: bool) -> None:
        self.dynamic = dynamic
        self.symbols = symbols
        self.env = {k: sympy.Integer(int(v)) for k, v in zip(symbols.order, values)}
        self.exprs: list[sympy.Expr] = []
        self.index: dict[sympy.Expr, int] = {}

    def size(self, n: Any) -> tuple[int, int]:
        """(bound, runtime size index or -1) of one dim."""
        if not isinstance(n, torch.SymInt):
            return int(n), -1
        e = _expr(n)
        v = int(e.xreplace(self.env))
        if not self.dynamic or e.is_number:
            return v, -1
        if e not in self.index:
            self.index[e] = len(self.exprs)
            self.exprs.append(e)
        return v, self.index[e]

    def type(self, t: torch.Tensor) -> tuple:
        """(dtype, bound shape, dims) of a tensor value, as _C._Graph takes it."""
        sizes = [self.size(n) for n in t.shape]
        dims = [k for _, k in sizes]
        return t.dtype, [b for b, _ in sizes], dims if any(k >= 0 for k in dims) else []

    def is_dynamic(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and any(
            isinstance(n, torch.SymInt) and not _expr(n).is_number for n in t.shape)

    def ints(self, xs: Any) -> list[int]:
        return [int(_expr(x).xreplace(self.env)) for x in xs]

    def arg(self, v: Any, op: str, arg: str) -> int:
        """A SymInt argument of `op` (its value in the module)."""
        if isinstance(v, (torch.SymFloat, torch.SymBool)):
            if self.dynamic:
                raise NotBounded(f"{op} takes a symbolic {type(v).__name__} as its '{arg}' value")
            e = v.node.expr.xreplace(self.env)
            return bool(e) if isinstance(v, torch.SymBool) else float(e)
        if self.dynamic and not _expr(v).is_number and (op.split(".")[0], arg) not in _SIZE_ARGS:
            raise NotBounded(f"{op} takes a symbolic size as its '{arg}' value")
        return int(_expr(v).xreplace(self.env))

    def check_op(self, name: str, node: torch.fx.Node, outs: list) -> None:
        """Raises NotBounded when `node` touches a dynamic dim the padder
        would not handle."""
        if not self.dynamic:
            return
        ins = [a.meta.get("val") for a in node.all_input_nodes]
        if not any(self.is_dynamic(t) for t in ins + list(outs)):
            return
        base = name.split(".")[0]
        if base not in PADDER_SAFE:
            raise NotBounded(f"{name} on a dynamic dim")
        _check_positions(base, node, self.is_dynamic)

    def value_at(self, v: torch.SymInt, args: list) -> int:
        """A SymInt's value at a call (its arguments' sizes)."""
        env = {k: sympy.Integer(n) for k, n in zip(self.symbols.order, self.symbols.values(args))}
        return int(_expr(v).xreplace(env))

    def runtime_sizes(self, values: tuple) -> list[int]:
        env = {k: sympy.Integer(int(v)) for k, v in zip(self.symbols.order, values)}
        return [int(e.xreplace(env)) for e in self.exprs]


SMALL_BUCKET = 16  # strict eager's kSmallBucket (dynamic.cpp): buckets 4, 8, 16


def bucket_of(values: tuple, warm: tuple = (), row_bytes: tuple = ()) -> tuple:
    """Each symbol's bucket. A small value (<= 16) takes the smallest small
    bucket its symbol has already run at that holds it (`warm`: per symbol,
    those buckets), else its own coarse bucket, as strict eager's SmallBucket
    does (a batch of 3 after batches 4 and 5 reuses their 8-bucket instead of
    compiling a 4-bucket), while that adds at most the padding slack to each
    tensor past 1.25x (`row_bytes`: per symbol, the most bytes a row along a
    dim of it holds in any tensor of the graph); else its fine bucket (1-4,
    then even sizes: a large model's static cache at batch 3 stays at 3)."""
    key = []
    for i, v in enumerate(values):
        v = int(v)
        held = set(warm[i]) if i < len(warm) else set()
        if 2 <= v <= SMALL_BUCKET:
            key.append(int(_C._small_bucket(held, v, row_bytes[i] if i < len(row_bytes) else 0)))
        else:  # a large value its bucket; 0 and 1 a warm bucket that holds them, else themselves
            above = [w for w in held if w >= v] if v <= SMALL_BUCKET else []
            key.append(min(above) if above else bucket(v))
    return tuple(key)


def _tensor_shapes(gm: torch.fx.GraphModule) -> list:
    """(symbolic shape, item size) of every tensor the graph takes or makes."""
    out = []
    for node in gm.graph.nodes:
        for v in _vals(node.meta.get("val")):
            if isinstance(v, torch.Tensor):
                out.append(([_expr(n) if isinstance(n, torch.SymInt) else int(n) for n in v.shape],
                             v.element_size()))
    return out


def row_bytes(shapes: list, symbols: Symbols, values: tuple) -> tuple:
    """Per symbol: the most bytes a row along a dim of it holds in any of
    `shapes` (_tensor_shapes) at `values`."""
    env = {k: sympy.Integer(int(v)) for k, v in zip(symbols.order, values)}
    rows = [0] * len(values)
    for shape, item in shapes:
        sizes = [int(e.xreplace(env)) if isinstance(e, sympy.Expr) else e for e in shape]
        nbytes = item
        for n in sizes:
            nbytes *= n
        for i, sym in enumerate(symbols.order):
            v = int(values[i])
            if v > 0 and any(isinstance(e, sympy.Expr) and sym in e.free_symbols for e in shape):
                rows[i] = max(rows[i], nbytes // v)
    return tuple(rows)


def _dim_is_dynamic(t: torch.Tensor, dim: int) -> bool:
    n = t.shape[dim]
    return isinstance(n, torch.SymInt) and not _expr(n).is_number


def _check_positions(base: str, node: torch.fx.Node, is_dynamic: Any) -> None:
    """Ops that read positions of a dim: only of a static one (a negative or
    symbolic start, an index into a dynamic dim, would read the padding or
    wrap at the bound)."""
    args = node.args
    src = args[0].meta.get("val") if args and isinstance(args[0], torch.fx.Node) else None
    if not isinstance(src, torch.Tensor):
        return
    if base in ("slice", "select", "index_select", "gather"):
        dim = args[1] if len(args) > 1 else 0
        if not isinstance(dim, int):
            raise NotBounded(f"{base} along a symbolic dim")
        if not _dim_is_dynamic(src, dim):
            return
        if base == "slice":
            start = args[2] if len(args) > 2 and args[2] is not None else 0
            if isinstance(start, int) and start >= 0 and (len(args) < 5 or args[4] == 1):
                return
            raise NotBounded("slice of a dynamic dim from a symbolic or negative start, or with a step")
        raise NotBounded(f"{base} into a dynamic dim")
    if base == "index":
        for d, idx in enumerate(args[1] if len(args) > 1 else []):
            if idx is not None and _dim_is_dynamic(src, d):
                raise NotBounded("index into a dynamic dim")
    if base in ("view", "_unsafe_view", "reshape"):
        out = node.meta.get("val")
        if _segments(src.shape) != _segments(out.shape):
            raise NotBounded(f"{base} merging or splitting a dynamic dim {tuple(src.shape)} -> {tuple(out.shape)}")
    if base in ("native_layer_norm", "_fused_rms_norm", "native_layer_norm_backward", "_fused_rms_norm_backward"):
        x = args[1].meta.get("val") if base.endswith("_backward") else src  # backward: (grad_out, input, ...)
        shape = args[2] if base.endswith("_backward") else args[1]
        if any(_dim_is_dynamic(x, d) for d in range(x.dim() - len(shape), x.dim())):
            raise NotBounded(f"{base} over a dynamic dim (it counts the normalized elements statically)")
    if base.startswith("_scaled_dot_product_efficient_attention"):
        for t in args[:3]:
            v = t.meta.get("val") if isinstance(t, torch.fx.Node) else None
            if isinstance(v, torch.Tensor) and v.dim() == 4 and (_dim_is_dynamic(v, 1) or _dim_is_dynamic(v, 3)):
                raise NotBounded("attention with a dynamic head count or head dim")
    if base == "embedding" and _dim_is_dynamic(src, 0):
        raise NotBounded("embedding of a table with a dynamic number of rows")


def is_symbolic_graph(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) or (
                isinstance(val, torch.Tensor) and any(isinstance(n, torch.SymInt) for n in val.shape)):
            return True
    return False


def _count_exact(reason: str) -> None:
    _stats["exact_shape_graphs"] += 1
    _FALLBACKS[reason] = _FALLBACKS.get(reason, 0) + 1


class Bucketed:
    """A graph with symbolic shapes, called with concrete arguments: one
    bounded-dynamic module per bucket key, or (see the module docstring)
    one exact-shape module per concrete size, or, when the graph has an op
    without a rule, the graph run eagerly."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, dense_from: int | None) -> None:
        self.gm, self.dense_from = gm, dense_from
        self._boxed_call = True
        self.symbols = Symbols(gm)
        self.shapes = _tensor_shapes(gm)
        if self.symbols.missing:
            raise _Unsupported(f"symbols {', '.join(self.symbols.missing)} of no graph input")
        self.reason = unbounded_reason(gm)
        if self.reason is not None:
            _count_exact(self.reason)
        self.modules: dict[tuple, Any] = {}  # buckets -> (compiled, shapes) | None: exact shapes
        self.exact: dict[tuple, Any] = {}  # sizes -> (compiled, shapes)
        self.eager: Any = None  # the graph cannot be lowered at all
        self.sizes: dict[tuple, list] = {}  # sizes -> runtime sizes of their bucket's module
        self.keys: dict[tuple, tuple] = {}  # sizes -> their bucket key
        _stats["bucketed_graphs"] += 1

    def __call__(self, *call_args: Any) -> Any:
        args, boxed = _unbox(call_args)
        if self.eager is not None:
            return self.eager(args)
        values = self.symbols.values(args)
        entry = None
        if self.reason is None:
            key = self.keys.get(values)
            if key is None:
                rows = row_bytes(self.shapes, self.symbols, values)
                key = self.keys[values] = bucket_of(values, self._small_buckets(), rows)
            if key not in self.modules:
                self.modules[key] = self._bounded(args, key)
            entry = self.modules[key]
        if entry is None:
            entry = self.exact.get(values)
            if entry is None:
                entry = self._exact(args, values)
                if entry is None:
                    return self.eager(args)
        compiled, shapes = entry
        sizes = []
        if shapes.dynamic:
            sizes = self.sizes.get(values)
            if sizes is None:
                sizes = self.sizes[values] = shapes.runtime_sizes(values)
        return compiled.call(args, boxed, sizes)

    def _small_buckets(self) -> tuple:
        """Per symbol: the small buckets of the modules built so far."""
        warm = [set() for _ in self.symbols.order]
        for key, entry in self.modules.items():
            if entry is not None:
                for i, b in enumerate(key):
                    if b <= SMALL_BUCKET:
                        warm[i].add(b)
        return tuple(warm)

    def _bounded(self, args: list, key: tuple) -> Any:
        shapes = Shapes(self.symbols, key, dynamic=True)
        try:
            compiled = _Compiled(self.gm, args, self.dense_from, shapes)
        except NotBounded as e:
            reason = str(e)
        except (_Unsupported, RuntimeError, TypeError, ValueError, IndexError) as e:
            reason = f"the bounded module failed: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
        else:
            _stats["bucket_modules"] += 1
            return compiled, shapes
        self.reason = reason  # every bucket then runs exact shapes
        _count_exact(reason)
        return None

    def _exact(self, args: list, values: tuple) -> Any:
        shapes = Shapes(self.symbols, values, dynamic=False)
        compiled, reason = _lower(lambda: _Compiled(self.gm, args, self.dense_from, shapes))
        if compiled is None:
            self.eager = _fallback(self.gm, reason)
            return None
        _stats["exact_shape_modules"] += 1
        self.exact[values] = (compiled, shapes)
        return self.exact[values]


def _segments(shape: Any) -> tuple:
    """A shape as its dynamic dims in order, each with the product of the
    static dims before it, and the product of the trailing static dims: a
    reshape keeping these only splits and merges static dims (XLA's padder
    does not follow a padded dim merged with others: the padding would land
    among the real rows)."""
    segs, prod = [], 1
    for n in shape:
        if isinstance(n, torch.SymInt) and not _expr(n).is_number:
            segs.append((prod, _expr(n)))
            prod = 1
        else:
            prod *= int(n)
    return tuple(segs), prod
