"""Lowering one FX graph of core ATen ops to one StableHLO module: the layer
under the torch.compile backend (compile.py) and its graphs with symbolic
shapes (compile_symbolic.py), which both build modules with it.

It holds :class:`_Compiled` (a graph lowered through ``torch_tpu._C._Graph``
to one executable, called with the graph's inputs, boxed) with the helpers it
lowers nodes with (``_op_name``, ``_has_rule``, ``_schema_values``,
``_full_outputs``, ``_graph_value``, ``_tensor_vals``, ``_is_tpu``,
``_flat``, ``_contiguous_strides``); :class:`_Recorder`, the builder calls
it records so that a graph loaded from the AOTAutograd cache is rebuilt; the
errors that stop a lowering (:class:`_Unsupported`: the graph then runs
eagerly; :class:`NotBounded`: a graph with symbolic shapes then runs exact
shapes); :func:`is_symbolic_target` (FX nodes that compute sizes, no graph
value); :func:`_lower` (a module, or why not); :func:`_fallback` (the graph
run eagerly, op by op); :func:`_unbox`; and the backend's graph counters
``_stats`` (reported by ``compile.stats()``).

It imports neither compile.py nor compile_symbolic.py; both import it.
"""
from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx

from . import _C

_stats = {"graphs": 0, "native_graphs": 0, "fallback_graphs": 0, "graphs_from_cache": 0}


class _Unsupported(Exception):
    """A node the graph builder cannot lower (the graph then runs eagerly)."""


class NotBounded(Exception):
    """The graph cannot run bounded dynamic (it runs exact shapes)."""


def _op_name(target: torch._ops.OpOverload) -> str:
    """ATen schema name without "aten::": "add.Tensor", "native_layer_norm"."""
    schema = target._schema
    base = schema.name.split("::", 1)[1]
    return f"{base}.{schema.overload_name}" if schema.overload_name else base


def _has_rule(name: str) -> bool:
    return bool(_C._Graph.has_rule(name))


# Runtime assertions on sizes AOTAutograd leaves in a symbolic graph: the
# guards Dynamo installed already hold for the sizes a call brings.
_SIZE_ASSERTS = ("_assert_scalar", "sym_constrain_range_for_size", "sym_constrain_range")


def is_symbolic_target(node: torch.fx.Node) -> bool:
    """A node computing a SymInt (sizes, their arithmetic) or asserting on
    one: no graph value."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload) and t._schema.name.split("::")[-1] in _SIZE_ASSERTS:
        return True
    val = node.meta.get("val")
    if not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False
    t = node.target
    return t in (torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default,
                 torch.ops.aten.sym_stride.int, torch.ops.aten.sym_storage_offset.default) or \
        getattr(t, "__module__", None) in ("_operator", "operator") or t in vars(operator).values() or \
        getattr(t, "__module__", "").startswith("torch.sym") or t in (torch.sym_max, torch.sym_min, torch.sym_not)


def _schema_values(node: torch.fx.Node) -> list[Any]:
    """The node's value of each schema argument, in schema order (defaults
    filled in): the raw FX arguments the graph builder decodes as eager calls
    are decoded (csrc/aten/call_args.h)."""
    schema = node.target._schema
    out = []
    for i, a in enumerate(schema.arguments):
        if not a.kwarg_only and i < len(node.args):
            v = node.args[i]
        elif a.name in node.kwargs:
            v = node.kwargs[a.name]
        elif a.has_default_value():
            v = a.default_value
        else:
            v = None
        out.append(v)
    return out


def _full_outputs(node: torch.fx.Node) -> tuple[list[torch.Tensor], list[Any]]:
    """An op with ``output_mask`` that skips some outputs (None in the graph):
    the rules always compute every output, so ask for all of them (the fake
    values come from running the op on the fake inputs with a full mask) and
    let the unused ones be dropped from the module.
    """
    schema = node.target._schema
    names = [a.name for a in schema.arguments]
    if "output_mask" not in names:
        raise _Unsupported(f"returns {node.meta.get('val')!r}")
    values = _schema_values(node)
    i = names.index("output_mask")
    values[i] = [True] * len(values[i])
    fake = [torch.fx.node.map_arg(v, lambda n: n.meta["val"]) for v in values]
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([f for f in fake if isinstance(f, torch.Tensor)])
    if mode is None:
        raise _Unsupported("no fake mode for output_mask")
    with mode:
        full = node.target(*fake)
    return _tensor_vals(full), values


def _graph_value(n: torch.fx.Node, env: dict, consts: dict) -> Any:
    """An FX node in an argument: a value of the graph, or a number the graph
    was specialized for."""
    if n in consts:
        return consts[n]
    if n in env:
        return _C._GraphValue(env[n])
    raise _Unsupported(f"argument {n.name} ({n.meta.get('val')!r}) is not a tensor of the graph")


def _tensor_vals(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in val):
        return list(val)
    raise _Unsupported(f"returns {val!r}")


def _is_tpu(t: torch.Tensor) -> bool:
    return t.device.type == "tpu"


def _is_cpu_scalar(t: torch.Tensor) -> bool:
    """A 0-d CPU tensor: an input a graph uploads as a number, or a value
    computed from such inputs (``dynamic=True`` passes float constants, an
    epsilon or a scaling factor, as 0-d float64 CPU tensors and converts them
    in the graph). Inside the module it is one more device value; it may not
    be a graph output (the caller would get it on the wrong device)."""
    return t.device.type == "cpu" and t.dim() == 0


class _Compiled:
    """A graph lowered to one executable; called with the graph's inputs (boxed)."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any] = (),
                 dense_from: int | None = None, shapes: Any = None) -> None:
        # Outputs from index `dense_from` on (a forward graph's tensors saved
        # for backward) are returned dense: only the backward graph reads
        # them, which does not depend on their strides, and writing a
        # transposed copy of each (e.g. every weight's t()) costs more than
        # the matmuls that use them.
        self.dense_from = dense_from
        self.example_inputs = list(example_inputs)
        self.inputs_numbers: list[tuple[int, Any]] = []
        self._boxed_call = True  # an instance attribute: wrappers copy __dict__
        self.graph = _Recorder(_C._Graph())
        self.device: int | None = None
        self.inputs: list[tuple[str, Any]] = []  # ("arg", position) | ("const", tensor)
        self.outputs: list[tuple[str, Any]] = []  # ("graph", k) | ("input", pos) | ("const", v)
        # A graph with symbolic shapes (compile_symbolic.Shapes): its sizes
        # evaluated for this module (at the buckets, dims dynamic, or exact).
        self.shapes = shapes
        self._build(gm)

    def _type(self, t: torch.Tensor) -> tuple:
        if self.shapes is None:
            return t.dtype, list(t.shape)
        return self.shapes.type(t)

    def _ints(self, xs: Any) -> list[int]:
        return list(xs) if self.shapes is None else self.shapes.ints(xs)

    def _arg(self, n: torch.fx.Node, env: dict, consts: dict, sym: dict, op: str, arg: str) -> Any:
        if n in sym:
            return self.shapes.arg(sym[n], op, arg)
        return _graph_value(n, env, consts)

    def _set_device(self, t: torch.Tensor) -> None:
        if _is_tpu(t):
            idx = t.device.index or 0
            if self.device is None:
                self.device = idx
            elif self.device != idx:
                raise _Unsupported("tensors on several tpu devices")

    def _build(self, gm: torch.fx.GraphModule) -> None:
        g = self.graph
        env: dict[torch.fx.Node, int] = {}
        multi: dict[torch.fx.Node, list[int]] = {}
        placeholders: dict[torch.fx.Node, int] = {}
        input_index: dict[torch.fx.Node, int] = {}  # placeholder -> graph input
        mutations: dict[int, int] = {}  # graph input -> id of its new value
        missing: list[str] = []
        consts: dict[torch.fx.Node, Any] = {}
        sym: dict[torch.fx.Node, Any] = {}  # nodes holding SymInts (sizes)
        self.consts = consts
        position = 0
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                val = node.meta.get("val")
                pos = position
                position += 1
                if self.shapes is not None and isinstance(val, torch.SymInt):
                    sym[node] = val  # read by compile_symbolic.Symbols at call time
                    continue
                if not isinstance(val, torch.Tensor):
                    example = self.example_inputs[pos] if pos < len(self.example_inputs) else None
                    if val is None and isinstance(example, (bool, int, float)):
                        # A number the graph was traced (specialized) for.
                        consts[node] = example
                        self.inputs_numbers.append((pos, example))
                        continue
                    raise _Unsupported(f"non-tensor graph input {node.name} ({type(val).__name__})")
                if not _is_tpu(val) and val.dim() != 0:
                    raise _Unsupported(f"graph input {node.name} on {val.device}")
                self._set_device(val)
                input_index[node] = len(self.inputs)
                env[node] = g.add_input(*self._type(val))
                placeholders[node] = pos
                self.inputs.append(("arg", pos))
            elif node.op == "get_attr":
                attr = getattr(gm, node.target)
                if not isinstance(attr, torch.Tensor):
                    raise _Unsupported(f"attribute {node.target}")
                self._set_device(attr)
                env[node] = g.add_input(attr.dtype, list(attr.shape))
                self.inputs.append(("const", attr))
            elif node.op == "call_function":
                if self.shapes is not None and is_symbolic_target(node):
                    sym[node] = node.meta["val"]
                    continue
                if self._symbolic_scalar(node, env, consts, sym):
                    continue
                if node.target is operator.getitem:
                    src, idx = node.args
                    if src not in multi:
                        if missing:
                            continue
                        raise _Unsupported(f"getitem on {src}")
                    env[node] = multi[src][idx]
                    continue
                if not isinstance(node.target, torch._ops.OpOverload):
                    raise _Unsupported(f"call to {node.target}")
                name = _op_name(node.target)
                if node.target is torch.ops.aten.copy_.default and node.args[0] in placeholders:
                    # AOTAutograd's epilogue for a mutated input: an in-place
                    # update through donation (see Graph::SetOutputs).
                    if missing:
                        continue
                    self._mutation(node, input_index, env, mutations)
                    continue
                if not node.target._schema.name.startswith("aten::"):
                    # A custom op lowers through its own rule, if it has one
                    # (torch_tpu.pallas.jax_op registers a Graph-scope rule "ns::name").
                    name = node.target._schema.name
                if node.target._schema.is_mutable:
                    missing.append(name)
                    continue
                if not _has_rule(name):
                    missing.append(name)
                    continue
                if missing:
                    continue  # only collecting the names now
                values = None
                val = node.meta.get("val")
                try:
                    if isinstance(val, (tuple, list)) and any(v is None for v in val):
                        outs, values = _full_outputs(node)
                    else:
                        outs = _tensor_vals(val)
                except _Unsupported as e:
                    raise _Unsupported(f"{name} {e}") from None
                for o in outs:
                    if not (_is_tpu(o) or _is_cpu_scalar(o)):
                        raise _Unsupported(f"{name} produces a tensor on {o.device}")
                    self._set_device(o)
                if self.shapes is not None:
                    self.shapes.check_op(name, node, outs)
                if name in ("as_strided", "as_strided_scatter"):
                    src = node.args[0].meta.get("val")
                    if not (src.is_contiguous() and src.storage_offset() == 0):
                        raise _Unsupported("as_strided of a non-contiguous tensor")
                if values is None:
                    values = _schema_values(node)
                names = [a.name for a in node.target._schema.arguments]
                args = [torch.fx.node.map_arg(v, lambda n, a=a: self._arg(n, env, consts, sym, name, a))
                        for v, a in zip(values, names)]
                try:
                    ids = g.add_op(name, args, [self._type(o) for o in outs])
                except RuntimeError as e:
                    raise _Unsupported(f"{name}: {e}") from e
                if isinstance(node.meta.get("val"), torch.Tensor):
                    env[node] = ids[0]
                else:
                    multi[node] = ids
            elif node.op == "output":
                if missing:
                    break
                ids, strides = [], []
                for index, item in enumerate(_flat(node.args[0])):
                    if isinstance(item, torch.fx.Node):
                        if item in sym and isinstance(sym[item], torch.SymInt):
                            # A size saved for backward: its value at the call.
                            self.outputs.append(("size", sym[item]))
                        elif item in placeholders:
                            self.outputs.append(("input", placeholders[item]))
                        elif item in env:
                            val = item.meta.get("val")
                            if isinstance(val, torch.Tensor) and not _is_tpu(val):
                                raise _Unsupported(f"graph output {item.name} on {val.device}")
                            self.outputs.append(("graph", len(ids)))
                            ids.append(env[item])
                            if not isinstance(val, torch.Tensor):
                                strides.append(None)
                            elif self.dense_from is not None and index >= self.dense_from:
                                strides.append(_contiguous_strides(self._ints(val.shape)))
                            else:
                                strides.append(self._ints(val.stride()))
                        else:
                            raise _Unsupported(f"graph output {item.name}")
                    elif item is None or isinstance(item, (bool, int, float)):
                        self.outputs.append(("const", item))
                    else:
                        raise _Unsupported(f"graph output {item!r}")
                if any(s is None for s in strides):
                    raise _Unsupported("non-tensor graph output")
                g.set_outputs(ids, strides, sorted(mutations.items()))
            else:
                raise _Unsupported(f"{node.op} node")
        if missing:
            raise _Unsupported("no lowering rule for " + ", ".join(sorted(set(missing))))
        if self.device is None:
            self.device = torch.tpu.current_device() if hasattr(torch, "tpu") else 0
        g.compile(self.device)

    def _symbolic_scalar(self, node: torch.fx.Node, env: dict, consts: dict, sym: dict) -> bool:
        """A CPU scalar_tensor of a symbolic value (``x / math.sqrt(x.shape[-1])``):
        a number of an exact-shape module (a bounded one refuses it)."""
        if self.shapes is None or node.target is not torch.ops.aten.scalar_tensor.default:
            return False
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or _is_tpu(val):
            return False
        v = node.args[0]
        consts[node] = self._arg(v, env, consts, sym, "scalar_tensor", "s") if isinstance(v, torch.fx.Node) else v
        return True

    def _mutation(self, node: torch.fx.Node, input_index: dict, env: dict, mutations: dict) -> None:
        dst, src = node.args[0], node.args[1]
        dval, sval = dst.meta.get("val"), src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if not isinstance(sval, torch.Tensor) or src not in env:
            raise _Unsupported(f"copy_ into graph input {dst.name} from {src!r}")
        if not _is_tpu(dval):
            raise _Unsupported(f"in-place update of graph input {dst.name} on {dval.device}")
        if sval.dtype != dval.dtype or tuple(sval.shape) != tuple(dval.shape):
            raise _Unsupported(f"copy_ into graph input {dst.name} with a dtype or shape change")
        mutations[input_index[dst]] = env[src]
        env[node] = env[src]  # copy_ returns the updated input

    def __call__(self, *call_args: Any) -> list:
        args, boxed = _unbox(call_args)
        return self.call(args, boxed)

    def call(self, args: list, boxed: bool, sizes: Sequence[int] = ()) -> list:
        """Runs the module; `sizes`: the runtime sizes of its dynamic dims."""
        for pos, number in self.inputs_numbers:
            if args[pos] != number:
                raise RuntimeError(f"torch_tpu: compiled graph was specialized for input {pos} == "
                                   f"{number}, got {args[pos]}")
        tensors = []
        for kind, v in self.inputs:
            t = args[v] if kind == "arg" else v
            if not _is_tpu(t):
                t = t.to(f"tpu:{self.device}")
                if kind == "const":
                    self.inputs[self.inputs.index((kind, v))] = (kind, t)
            tensors.append(t)
        outs = self.graph.run(tensors, list(sizes))
        result = []
        for kind, v in self.outputs:
            if kind == "graph":
                result.append(outs[v])
            elif kind == "input":
                result.append(args[v])
            elif kind == "size":
                result.append(self.shapes.value_at(v, args))
            else:
                result.append(v)
        if boxed:
            args.clear()
        return result


def _unbox(call_args: tuple) -> tuple[list, bool]:
    """(arguments, boxed) of a compiled graph's call: boxed (one list, which
    the callee may clear) or plain positional arguments."""
    boxed = len(call_args) == 1 and isinstance(call_args[0], list)
    return (call_args[0] if boxed else list(call_args)), boxed


class _Recorder:
    """The C++ graph builder, recording the calls that build the module, so
    that a graph loaded from PyTorch's AOTAutograd cache is rebuilt by
    replaying them (no tracing) and its executable comes from the disk cache."""

    __slots__ = ("g", "calls")

    def __init__(self, g: Any) -> None:
        self.g = g
        self.calls: list[tuple[str, tuple]] = []

    def add_input(self, *args: Any) -> Any:
        self.calls.append(("add_input", args))
        return self.g.add_input(*args)

    def add_op(self, *args: Any) -> Any:
        self.calls.append(("add_op", args))
        return self.g.add_op(*args)

    def set_outputs(self, *args: Any) -> Any:
        self.calls.append(("set_outputs", args))
        return self.g.set_outputs(*args)

    def compile(self, device: int) -> None:
        self.g.compile(device)

    def run(self, tensors: list, sizes: Sequence[int] = ()) -> list:
        return self.g.run(tensors, list(sizes))


def _flat(out: Any) -> list:
    """The items of an (AOTAutograd, hence flat) graph output."""
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    if any(isinstance(o, (tuple, list, dict)) for o in items):
        raise _Unsupported("nested graph outputs")
    return items


def _fallback(gm: torch.fx.GraphModule, reason: str) -> Callable:
    _stats["fallback_graphs"] += 1
    warnings.warn(
        f"torch_tpu: torch.compile(backend='tpu') runs a graph eagerly, op by op "
        f"({reason}); the results are correct but the graph is not compiled as one module",
        stacklevel=2,
    )
    from torch._functorch.aot_autograd import make_boxed_func

    # Saved-for-backward tensors come dense from compiled forward graphs (see
    # _Compiled): give the eager graph the strides it was traced with, which
    # matters to ops that read storage geometry (as_strided).
    traced = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    restride = [i for i, v in enumerate(traced) if isinstance(v, torch.Tensor) and not v.is_contiguous()]
    if not restride:
        return make_boxed_func(gm.forward)

    def forward(*args: Any) -> Any:
        args = list(args)
        for i in restride:
            t, v = args[i], traced[i]
            if isinstance(t, torch.Tensor) and t.shape == v.shape and t.stride() != v.stride():
                args[i] = torch.empty_strided(v.shape, v.stride(), dtype=t.dtype, device=t.device).copy_(t)
        return gm.forward(*args)

    return make_boxed_func(forward)


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, n = [], 1
    for d in reversed(list(shape)):
        strides.append(n)
        n *= max(int(d), 1)
    return strides[::-1]


def _lower(build: Callable[[], Any]) -> tuple[Any, str | None]:
    """(build(), None), or (None, why) when the graph cannot be lowered (an
    op without a rule, or the builder refused it)."""
    try:
        return build(), None
    except _Unsupported as e:
        return None, str(e)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        return None, f"graph lowering failed: {e}"
