"""``torch.tpu.pallas``: JAX functions (Pallas kernels included) as torch ops.

``jax_op("ns::name", fn)`` registers ``fn``, a JAX function with annotated
parameters, as the custom op ``torch.ops.ns.name``:

- its fake kernel traces ``fn`` (``jax.eval_shape``), so it works on meta
  tensors and inside ``torch.compile``;
- on tpu it exports ``fn`` with ``jax.export`` for the platform that runs
  (``torch.tpu.get_platform()``) and runs the StableHLO as ONE executable,
  compiled once per shape signature (memory and disk caches);
- inside ``torch.compile(backend="tpu")`` graphs the exported module is
  embedded in the graph's module and called there (``func.call``): one op of
  the graph, no graph break;
- under fused eager (``torch_tpu.fused()``) a call joins the chain being
  recorded (its module embedded in the chain's and called there), so it
  does not end the fused region; a call that donates runs alone;
- autograd goes through ``jax.vjp`` of the same function (one more exported
  op, ``ns::name_jax_vjp``);
- ``donate_argnums`` gives those tensor inputs' buffers to the execution for
  an output of the same dtype and size; a donated tensor must not be used
  again (reading it raises an error);
- on CPU tensors it runs ``fn`` with JAX on the CPU;
- in eager, calling the returned op skips torch.library's Python dispatch
  (autograd wrapper, redispatch) when nothing needs it: no gradient to
  record, plain tpu tensors, no dispatch / function mode, functorch
  transform or profiler active. Each shape signature's export is registered
  once with the runtime (``_C._custom_module_handle``), so a call passes a
  handle, not the module text. ``torch.ops.ns.name`` always dispatches.

Parameters annotated ``jax.Array`` / ``torch.Tensor`` (optionally
``Optional[...]``, or ``list``/``Sequence``/``tuple[..., ...]`` of them) are
tensors; ``int``, ``float``, ``bool`` and ``str`` parameters are static
(compile-time) values; unannotated parameters are tensors. The return
annotation says what comes back: ``jax.Array``, ``tuple[jax.Array, ...]`` of
a fixed length, or ``list[jax.Array]``.

Pallas kernels run on XLA:CPU with ``pl.pallas_call(..., interpret=True)``.
JAX is optional: ``pip install jax==0.10.2 jaxlib==0.10.2``.
"""
from __future__ import annotations

import collections.abc
import hashlib
import inspect
import sys
import types
import typing
from typing import Any, Callable, Sequence, Union

import torch

from . import _C
from .jax_dynamic import DynamicPolicy
from .jax_types import _FROM_HLO, _WIDE, _avals_of, _jax_dtype, _torch_dtype

__all__ = ["jax_op", "custom_jax_kernel"]

_INSTALL = "pip install jax==0.10.2 jaxlib==0.10.2"


def _jax() -> Any:
    try:
        import jax  # noqa: PLC0415  (optional, slow to import: only when used)
        import jax.numpy  # noqa: F401,PLC0415
    except ImportError as e:
        raise ImportError(f"torch_tpu.pallas.jax_op needs JAX, which is not installed ({e}); "
                          f"install it with `{_INSTALL}`") from e
    return jax


# ------------------------------------------------------------------ signatures

class _Param:
    """One parameter of the JAX function: kind "tensor", "tensors" or "static"."""

    def __init__(self, p: inspect.Parameter, op: str) -> None:
        self.name = p.name
        self.keyword_only = p.kind is inspect.Parameter.KEYWORD_ONLY
        self.positional_only = p.kind is inspect.Parameter.POSITIONAL_ONLY
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ValueError(f"jax_op {op}: *args / **kwargs parameters are not supported "
                             f"(parameter {p.name})")
        self.kind, self.schema_type = _classify(p.annotation, p.name, op)
        self.default = p.default

    def schema(self) -> str:
        s = f"{self.schema_type} {self.name}"
        if self.default is not inspect.Parameter.empty:
            s += "=" + _schema_default(self.default, self.name)
        return s


def _is_array(t: Any) -> bool:
    if t is torch.Tensor or t in ("jax.Array", "Array", "torch.Tensor", "Tensor"):
        return True
    jax = sys.modules.get("jax")
    return jax is not None and t is jax.Array


def _classify(ann: Any, name: str, op: str) -> tuple[str, str]:
    if ann is inspect.Parameter.empty or _is_array(ann):
        return "tensor", "Tensor"
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and _is_array(rest[0]):
            return "tensor", "Tensor?"
    if origin in (list, tuple, collections.abc.Sequence) and args and _is_array(args[0]):
        if origin is not tuple or (len(args) == 2 and args[1] is Ellipsis) or \
                all(_is_array(a) for a in args):
            return "tensors", "Tensor[]"
    statics = {int: "int", float: "float", bool: "bool", str: "str"}
    if ann in statics:
        return "static", statics[ann]
    raise ValueError(f"jax_op {op}: parameter {name!r} has annotation {ann!r}; supported: "
                     "jax.Array (Optional, list/Sequence/tuple of), int, float, bool, str")


def _schema_default(v: Any, name: str) -> str:
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise ValueError(f"jax_op: default of parameter {name!r} ({v!r}) cannot be in a torch schema")


def _returns(ann: Any, op: str) -> tuple[str, int]:
    """(schema returns, number of tensors; -1 for a list)."""
    if _is_array(ann):
        return "Tensor", 1
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is tuple and args and all(_is_array(a) for a in args):
        return "(" + ", ".join(["Tensor"] * len(args)) + ")", len(args)
    if origin in (list, tuple, collections.abc.Sequence) and args and _is_array(args[0]):
        return "Tensor[]", -1
    raise ValueError(f"jax_op {op}: annotate the JAX function's return: jax.Array, "
                     f"tuple[jax.Array, jax.Array] or list[jax.Array] (got {ann!r})")


def _signature_of(fn: Callable) -> inspect.Signature:
    """The signature with string annotations (``from __future__ import
    annotations``) evaluated; ``jax`` and ``torch`` resolve even where the
    function's module imports them locally."""
    names = {"jax": _jax(), "torch": torch, "typing": typing, "Optional": typing.Optional,
             "Union": Union, "Sequence": Sequence}
    try:
        return inspect.signature(fn, eval_str=True, locals=names)
    except (NameError, TypeError, SyntaxError):
        return inspect.signature(fn)


# ------------------------------------------------------------------ the op

class _Export:
    """One shape signature's export: cache key, module text, outputs."""

    def __init__(self, key: str, text: str, outputs: list[tuple[torch.dtype, list[int]]]) -> None:
        self.key, self.text, self.outputs = key, text, outputs


class _JaxOp:
    """The machinery behind one custom op whose body is a JAX computation.

    ``body(values)`` gets the op's arguments in schema order with tensors
    replaced by JAX arrays and returns a flat list of arrays.
    """

    def __init__(self, name: str, params: list[_Param], returns: tuple[str, int],
                 body: Callable[[list], list], donate: Sequence[int] = ()) -> None:
        self.name, self.params, self.body = name, params, body
        self.returns, self.n_out = returns
        self.donate_params = set(donate)
        self._exports: dict[tuple, _Export] = {}
        self._avals: dict[tuple, list] = {}
        self._cpu_fns: dict[tuple, Any] = {}  # jitted per signature (CPU tensors)
        self._ready: dict[tuple, tuple] = {}  # signature -> (runtime handle, donated indices)
        self._names = {p.name for p in params}
        self.dynamic = DynamicPolicy(self)  # bounded dynamic dims (jax_dynamic.py)
        schema = "(" + _params_schema(params) + ") -> " + self.returns
        self.op = torch.library.custom_op(name, self._cpu, mutates_args=(), schema=schema)
        self.op.register_fake(self._fake)
        self.op.register_kernel("tpu", self._tpu)
        _C._register_custom_module_rule(name, self._graph_module)

    # ---- arguments
    def bind(self, args: tuple, kwargs: dict) -> list:
        """The op's arguments in schema order (defaults filled in)."""
        values = list(args)
        for p in self.params[len(args):]:
            values.append(kwargs[p.name] if p.name in kwargs else p.default)
        return values

    def tensors(self, values: list) -> list:
        out = []
        for p, v in zip(self.params, values):
            if p.kind == "tensor" and v is not None:
                out.append(v)
            elif p.kind == "tensors":
                out.extend(v)
        return out

    def signature(self, values: list) -> tuple:
        def aval(t: torch.Tensor) -> tuple:
            if any(not isinstance(d, int) for d in t.shape):
                raise RuntimeError(f"jax_op {self.name}: symbolic shapes are not supported; "
                                   "compile with dynamic=False")
            return ("T", t.dtype, tuple(t.shape))
        sig = []
        for p, v in zip(self.params, values):
            if p.kind == "tensor":
                sig.append(None if v is None else aval(v))
            elif p.kind == "tensors":
                sig.append(("L", tuple(aval(t) for t in v)))
            else:
                sig.append(("S", tuple(v) if isinstance(v, list) else v))
        return tuple(sig)

    def flat_fn(self, sig: tuple) -> Callable:
        """The JAX function of the flat tensor inputs for one signature."""
        def flat(*arrays: Any) -> list:
            it = iter(arrays)
            values = []
            for p, s in zip(self.params, sig):
                if p.kind == "tensor":
                    values.append(None if s is None else next(it))
                elif p.kind == "tensors":
                    values.append([next(it) for _ in s[1]])
                else:
                    values.append(s[1])
            return self.body(values)
        return flat

    def structs(self, sig: tuple) -> list:
        jax = _jax()
        return [jax.ShapeDtypeStruct(a[2], _jax_dtype(a[1], self.name)) for a in _avals_of(sig)]

    # ---- tracing and export
    def _x64(self, sig: tuple) -> Any:
        """64-bit tensors need JAX's x64 mode (else JAX narrows them)."""
        import contextlib  # noqa: PLC0415
        wide = any(a[1] in _WIDE for a in _avals_of(sig))
        return _jax().enable_x64(True) if wide else contextlib.nullcontext()

    def out_avals(self, sig: tuple) -> list:
        if sig not in self._avals:
            jax = _jax()
            with self._x64(sig):
                outs = jax.eval_shape(self.flat_fn(sig), *self.structs(sig))
            self._avals[sig] = [(_torch_dtype(o.dtype, self.name), list(o.shape)) for o in outs]
        return self._avals[sig]

    def export(self, sig: tuple) -> _Export:
        e = self._exports.get(sig)
        if e is None:
            e = self._exports[sig] = self._export(sig)
        return e

    def _export(self, sig: tuple) -> _Export:
        jax = _jax()
        platform = torch.tpu.get_platform()
        try:
            with self._x64(sig):
                exported = jax.export.export(
                    jax.jit(self.flat_fn(sig), keep_unused=True), platforms=[platform],
                    disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")],
                )(*self.structs(sig))
        except Exception as e:  # noqa: BLE001  (JAX raises many types)
            raise RuntimeError(f"jax_op {self.name}: jax.export of the JAX function for platform "
                               f"{platform!r} failed: {type(e).__name__}: {e}") from e
        from jax._src.interpreters import mlir  # noqa: PLC0415

        with mlir.make_ir_context():
            module = mlir.ir.Module.parse(exported.mlir_module())
            text = module.operation.get_asm(enable_debug_info=False)
        digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
        outputs = [(_torch_dtype(a.dtype, self.name), list(a.shape)) for a in exported.out_avals]
        return _Export(f"{self.name}|{digest}", text, outputs)

    # ---- results
    def pack(self, outs: list) -> Any:
        if self.n_out == -1:
            return list(outs)
        if len(outs) != self.n_out:
            raise RuntimeError(f"jax_op {self.name}: the JAX function returned {len(outs)} arrays, "
                               f"its return annotation says {self.n_out}")
        return outs[0] if self.returns == "Tensor" else tuple(outs)

    # ---- kernels
    def _fake(self, *args: Any, **kwargs: Any) -> Any:
        values = self.bind(args, kwargs)
        tensors = self.tensors(values)
        device = tensors[0].device if tensors else torch.device("meta")
        avals = self.out_avals(self.signature(values))
        return self.pack([torch.empty(s, dtype=d, device=device) for d, s in avals])

    def _tpu(self, *args: Any, **kwargs: Any) -> Any:
        values = self.bind(args, kwargs)
        return self.launch(values, self.signature(values))

    def launch(self, values: list, sig: tuple) -> Any:
        """Runs the export of ``sig`` on the tensors of ``values``."""
        tensors = self.tensors(values)
        out = self.dynamic.run(values, sig, tensors, self.donated(values))  # jax_dynamic.py
        if out is not None:
            return self.pack(out)
        ready = self._ready.get(sig)
        if ready is None:
            ready = self._ready[sig] = self._prepare(values, sig)
        handle, donate = ready
        return self.pack(_C._run_custom_module_handle(handle, tensors, donate))

    def donated(self, values: list) -> list:
        """The flat indices of the donated tensors of a call."""
        if not self.donate_params:
            return []
        donate, k = [], 0
        for i, (p, v) in enumerate(zip(self.params, values)):
            n = (0 if v is None else 1) if p.kind == "tensor" else len(v) if p.kind == "tensors" else 0
            if i in self.donate_params:
                donate.extend(range(k, k + n))
            k += n
        return donate

    def _prepare(self, values: list, sig: tuple) -> tuple:
        """(the runtime's handle of the export, the flat indices of donated tensors)."""
        e = self.export(sig)
        return _C._custom_module_handle(e.key, e.text, e.outputs), self.donated(values)

    def fast(self, args: tuple, kwargs: dict) -> Any:
        """The op's result computed without torch.library's Python dispatch
        (autograd wrapper, redispatch), where nothing needs it: no gradient
        to record, plain tpu tensors, no dispatch / function modes, functorch
        transforms or profiler. ``_SLOW`` where the dispatcher must run."""
        if len(args) > len(self.params) or _modes_active():
            return _SLOW
        values = list(args)
        for p in self.params[len(args):]:
            values.append(kwargs[p.name] if p.name in kwargs else p.default)
        if len(kwargs) and any(k not in self._names for k in kwargs):
            return _SLOW
        grad = torch.is_grad_enabled()
        sig = []
        for i, (p, v) in enumerate(zip(self.params, values)):
            if p.kind == "tensor":
                if v is None:
                    sig.append(None)
                    continue
                if type(v) is not torch.Tensor or v.device.type != "tpu" or (grad and v.requires_grad):
                    return _SLOW
                sig.append(("T", v.dtype, tuple(v.shape)))
            elif p.kind == "tensors":
                if not isinstance(v, (list, tuple)) or not all(
                        type(t) is torch.Tensor and t.device.type == "tpu"
                        and not (grad and t.requires_grad) for t in v):
                    return _SLOW
                sig.append(("L", tuple(("T", t.dtype, tuple(t.shape)) for t in v)))
            else:
                v = _static_value(p.schema_type, v)
                if v is _SLOW:
                    return _SLOW
                values[i] = v
                sig.append(("S", v))
        return self.launch(values, tuple(sig))

    def _cpu(self, *args: Any, **kwargs: Any) -> Any:
        jax = _jax()
        values = self.bind(args, kwargs)
        sig = self.signature(values)
        for t in self.tensors(values):
            if t.device.type != "cpu":
                raise RuntimeError(f"jax_op {self.name}: no kernel for tensors on {t.device}")
        with self._x64(sig):
            cpu = jax.devices("cpu")[0]
            arrays = [jax.device_put(t.detach().contiguous().numpy() if t.dtype != torch.bfloat16
                                     else t.detach().view(torch.int16).numpy().view("bfloat16"), cpu)
                      for t in self.tensors(values)]
            if sig not in self._cpu_fns:
                self._cpu_fns[sig] = jax.jit(self.flat_fn(sig))
            outs = self._cpu_fns[sig](*arrays)
        return self.pack([_from_jax(o) for o in outs])

    def _graph_module(self, args: list) -> str:
        """The module text for a torch.compile graph node's arguments."""
        values = []
        for p, a in zip(self.params, args):
            if p.kind == "tensor":
                values.append(None if a is None else _Aval(a))
            elif p.kind == "tensors":
                values.append([_Aval(t) for t in a])
            else:
                values.append(a)
        return self.export(self.signature(values)).text


_SLOW = object()  # fast(): the dispatcher must run this call
_REGISTERED: dict[str, Any] = {}  # "ns::name" -> the CustomOpDef jax_op returned


def registered_op(name: str) -> Any:
    """The op that ``jax_op(name, ...)`` returned (call it: in eager it skips
    torch.library's Python dispatch where nothing needs it)."""
    if name not in _REGISTERED:
        raise KeyError(f"torch_tpu.pallas: no jax_op named {name!r} is registered")
    return _REGISTERED[name]


def _modes_active() -> bool:
    """Whether anything that sees ops through the dispatcher is active."""
    from torch.autograd.profiler import _is_profiler_enabled  # noqa: PLC0415

    return bool(torch._C._len_torch_dispatch_stack() or torch._C._len_torch_function_stack()
                or torch._C._are_functorch_transforms_active() or _is_profiler_enabled)


def _static_value(schema_type: str, v: Any) -> Any:
    """A static argument as the schema converts it (int -> float), or _SLOW
    where the dispatcher must check it (it raises on a wrong type)."""
    if schema_type == "float" and type(v) in (int, float):
        return float(v)
    if schema_type == "int" and type(v) is int:
        return v
    if (schema_type == "bool" and type(v) is bool) or (schema_type == "str" and type(v) is str):
        return v
    return _SLOW


def _fast_op_def(op: Any, jax_op_: "_JaxOp") -> Any:
    """Makes the CustomOpDef ``op`` call ``jax_op_.fast`` first (it stays a
    CustomOpDef: same attributes, same ``torch.ops`` entry)."""
    op.__class__ = _FastCustomOpDef
    op._torch_tpu_jax_op = jax_op_
    return op


class _FastCustomOpDef(torch._library.custom_ops.CustomOpDef):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            out = self._torch_tpu_jax_op.fast(args, kwargs)
            if out is not _SLOW:
                return out
        return self._opoverload(*args, **kwargs)


class _Aval:
    """A graph value's dtype and shape, standing in for a tensor."""

    def __init__(self, a: tuple) -> None:
        self.dtype, self.shape = _FROM_HLO[a[1]], tuple(a[2])


def _from_jax(a: Any) -> torch.Tensor:
    import numpy as np  # noqa: PLC0415

    arr = np.asarray(a)
    if str(arr.dtype) == "bfloat16":
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


def _params_schema(params: list[_Param]) -> str:
    parts, star = [], False
    for p in params:
        if p.keyword_only and not star:
            parts.append("*")
            star = True
        parts.append(p.schema())
    return ", ".join(parts)


# ------------------------------------------------------------------ autograd

def _vjp_op(fwd: _JaxOp) -> _JaxOp:
    """``ns::name_jax_vjp(cotangents, *forward args) -> grads`` (one per tensor input)."""
    cts = _Param(inspect.Parameter("_cotangents", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   annotation=list[torch.Tensor]), fwd.name)
    params = [cts] + [_copy_param(p) for p in fwd.params]

    def body(values: list) -> list:
        jax = _jax()
        import numpy as np  # noqa: PLC0415

        cotangents, fwd_values = values[0], values[1:]
        primals = [v for p, v in zip(fwd.params, fwd_values) if p.kind == "tensor" and v is not None]
        primals += [t for p, v in zip(fwd.params, fwd_values) if p.kind == "tensors" for t in v]

        def of_primals(*arrays: Any) -> list:
            it = iter(arrays)
            vals = []
            for p, v in zip(fwd.params, fwd_values):
                if p.kind == "tensor":
                    vals.append(None if v is None else next(it))
                elif p.kind == "tensors":
                    vals.append([next(it) for _ in v])
                else:
                    vals.append(v)
            return fwd.body(vals)

        outs, pullback = jax.vjp(of_primals, *primals)
        cts_in = [c.astype(o.dtype) if jax.numpy.issubdtype(o.dtype, jax.numpy.inexact)
                  else np.zeros(o.shape, dtype=jax.dtypes.float0) for c, o in zip(cotangents, outs)]
        grads = pullback(cts_in)
        return [jax.numpy.zeros(p.shape, p.dtype) if g.dtype == jax.dtypes.float0 else g
                for g, p in zip(grads, primals)]

    return _JaxOp(fwd.name + "_jax_vjp", params, ("Tensor[]", -1), body)


def _copy_param(p: _Param) -> _Param:
    q = object.__new__(_Param)
    q.__dict__.update(p.__dict__)
    return q


def _register_autograd(fwd: _JaxOp) -> None:
    vjp = _vjp_op(fwd)

    def setup_context(ctx: Any, inputs: tuple, output: Any,
                      keyword_only_inputs: dict | None = None) -> None:
        ctx.values = fwd.bind(tuple(inputs), dict(keyword_only_inputs or {}))
        outs = [output] if isinstance(output, torch.Tensor) else list(output)
        ctx.out_meta = [(o.shape, o.dtype, o.device) for o in outs]

    def backward(ctx: Any, *grads: Any) -> tuple:
        flat = []
        for g in grads:
            flat.extend(g if isinstance(g, (list, tuple)) else [g])
        cts = [torch.zeros(s, dtype=d, device=dev) if g is None else g.contiguous()
               for g, (s, d, dev) in zip(flat, ctx.out_meta)]
        pos = [v for p, v in zip(fwd.params, ctx.values) if not p.keyword_only]
        kw = {p.name: v for p, v in zip(fwd.params, ctx.values) if p.keyword_only}
        tensor_grads = iter(vjp.op(cts, *pos, **kw))
        result = []
        for p, v in zip(fwd.params, ctx.values):
            if p.kind == "tensor":
                g = None if v is None else next(tensor_grads)
                result.append(g if v is not None and v.dtype.is_floating_point else None)
            elif p.kind == "tensors":
                gs = [next(tensor_grads) for _ in v]
                result.append([g if t.dtype.is_floating_point else None for g, t in zip(gs, v)])
            else:
                result.append(None)
        return tuple(r for r, p in zip(result, fwd.params) if not p.keyword_only)

    fwd.op.register_autograd(backward, setup_context=setup_context)


# ------------------------------------------------------------------ public API

def jax_op(name: str, fn: Callable | None = None, /, *, donate_argnums: Sequence[int] | None = None,
           mesh: Any = None, input_partition_specs: Any = None,
           output_partition_specs: Any = None) -> Any:
    """Registers the JAX function ``fn`` as the torch custom op ``name`` ("ns::name").

    Returns the op (call it with torch tensors); without ``fn``, a decorator.
    ``donate_argnums``: positions of tensor parameters whose buffers the
    execution may reuse; those tensors must not be used afterwards.
    ``mesh`` and the partition specs (multi-device kernels) are accepted for
    source compatibility and must be None here: torch_tpu runs a jax_op on
    one device.
    """
    if not isinstance(name, str) or name.count("::") != 1 or not all(name.split("::")):
        raise ValueError(f"jax_op: the op name must be 'namespace::name', got {name!r}")
    if any(x is not None for x in (mesh, input_partition_specs, output_partition_specs)):
        raise NotImplementedError(f"jax_op {name}: mesh / partition specs (multi-device kernels) "
                                  "are not supported by torch_tpu yet; pass None")

    def register(fn: Callable) -> Any:
        _jax()  # a clear error now if JAX is missing
        sig = _signature_of(fn)
        params = [_Param(p, name) for p in sig.parameters.values()]
        donate = list(donate_argnums or ())
        for i in donate:
            if not 0 <= i < len(params) or params[i].kind == "static":
                raise ValueError(f"jax_op {name}: donate_argnums entry {i} is not a tensor parameter")

        def body(values: list) -> list:
            jax = _jax()
            pos = [v for p, v in zip(params, values) if not p.keyword_only]
            kw = {p.name: v for p, v in zip(params, values) if p.keyword_only}
            return jax.tree_util.tree_leaves(fn(*pos, **kw))

        op = _JaxOp(name, params, _returns(sig.return_annotation, name), body, donate)
        _register_autograd(op)
        op.op.__doc__ = fn.__doc__
        _REGISTERED[name] = _fast_op_def(op.op, op)
        return op.op

    return register if fn is None else register(fn)


class _JaxKernel:
    """What :func:`custom_jax_kernel` returns: a callable running a JAX function
    on tpu tensors (any pytree of arguments), one export per signature."""

    def __init__(self, fn: Callable, name: str, static_argnums: Sequence[int],
                 donate_argnums: Sequence[int]) -> None:
        self.fn, self.name = fn, name
        self.static_argnums, self.donate_argnums = set(static_argnums), set(donate_argnums)
        self._exports: dict[Any, tuple[_Export, Any]] = {}

    def __call__(self, *args: Any) -> Any:
        from torch.utils import _pytree as pytree  # noqa: PLC0415

        leaves, tree = pytree.tree_flatten(list(args))
        owner = [i for i, a in enumerate(args) for _ in pytree.tree_leaves(a)]
        is_tensor = [isinstance(x, torch.Tensor) and owner[i] not in self.static_argnums
                     for i, x in enumerate(leaves)]
        key = (str(tree), tuple(("T", x.dtype, tuple(x.shape)) if t else ("S", x)
                                for x, t in zip(leaves, is_tensor)))
        if key not in self._exports:
            self._exports[key] = self._export(key, leaves, is_tensor, tree)
        e, out_tree = self._exports[key]
        tensors = [x for x, t in zip(leaves, is_tensor) if t]
        donate = [k for k, i in enumerate(i for i, t in enumerate(is_tensor) if t)
                  if owner[i] in self.donate_argnums]
        outs = _C._run_custom_module(e.key, e.text, tensors, e.outputs, donate)
        return _jax().tree_util.tree_unflatten(out_tree, outs)

    def _export(self, key: Any, leaves: list, is_tensor: list, tree: Any) -> tuple:
        from torch.utils import _pytree as pytree  # noqa: PLC0415

        jax = _jax()
        out_tree: list = []

        def body(values: list) -> list:
            arrays = iter(values[0])
            full = [next(arrays) if t else x for x, t in zip(leaves, is_tensor)]
            out, treedef = jax.tree_util.tree_flatten(self.fn(*pytree.tree_unflatten(full, tree)))
            out_tree.append(treedef)
            return out

        tensors = [("T", x.dtype, tuple(x.shape)) for x, t in zip(leaves, is_tensor) if t]
        exporter = object.__new__(_JaxOp)
        exporter.name, exporter.body = self.name, body
        exporter.params = [_Param(inspect.Parameter("tensors", inspect.Parameter.POSITIONAL_ONLY,
                                                    annotation=list[torch.Tensor]), self.name)]
        return exporter._export((("L", tuple(tensors)),)), out_tree[-1]


def custom_jax_kernel(jax_fn: Callable | None = None, name: str | None = None,
                      static_argnums: Sequence[int] = (), donate_argnums: Sequence[int] | None = None,
                      mesh: Any = None, input_partition_specs: Any = None,
                      output_partition_specs: Any = None) -> Any:
    """The lower-level form of :func:`jax_op`: returns a callable that runs
    ``jax_fn`` on tpu tensors (arguments and results may be any pytrees; no
    annotations needed). Arguments at ``static_argnums`` (and every
    non-tensor) are compile-time values. It registers no torch op: no
    autograd, and under ``torch.compile`` it runs between graphs. Without
    ``jax_fn``, a decorator."""
    if any(x is not None for x in (mesh, input_partition_specs, output_partition_specs)):
        raise NotImplementedError("custom_jax_kernel: mesh / partition specs (multi-device "
                                  "kernels) are not supported by torch_tpu yet; pass None")

    def register(fn: Callable) -> _JaxKernel:
        _jax()
        return _JaxKernel(fn, name or getattr(fn, "__name__", "kernel"), static_argnums,
                          donate_argnums or ())

    return register if jax_fn is None else register(jax_fn)
