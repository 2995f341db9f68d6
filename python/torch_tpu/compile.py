"""``torch.compile(model, backend="tpu")``: whole graphs as one StableHLO module.

Dynamo captures the graph, AOTAutograd splits it into forward and backward
graphs of core ATen ops (PyTorch's core-ATen decompositions, except for ops
that have a native lowering rule, which are kept whole), and each graph
becomes ONE StableHLO module built from the same lowering rules eager ops
use (``torch_tpu._C._Graph``), compiled once per input signature (Dynamo's
guards decide when to recompile; ``dynamic=False`` by default) and run as one
executable.

In-place mutations of graph inputs (buffers, KV caches, optimizer state)
stay in the graph (``keep_inference_input_mutations``): AOTAutograd ends the
graph with ``copy_(input, new_value)``, which becomes an in-place update
through PJRT buffer donation (the input's storage buffer is donated and takes
the module's result), not a copy: see ``stats()["inputs_donated"]``.

What a compile traced is saved in PyTorch's AOTAutograd cache (when
torch_tpu's disk cache is on), so another process compiling the same graph
skips AOTAutograd: see :func:`_output_code_classes`.

A graph containing an op without a rule (or that the builder cannot lower)
runs eagerly on the device, op by op, after one warning naming the ops:
slower, never wrong.

Plain ``torch.compile(model)`` (Inductor) cannot generate code for "tpu"
tensors (it would crash looking for JAX/Pallas): graphs whose inputs live on
tpu are routed to this backend instead (see :func:`_route_inductor`).
"""
from __future__ import annotations

import copy
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx

from . import _C
from . import compile_symbolic as _symbolic
from .compile_graph import _Compiled, _fallback, _has_rule, _lower, _op_name, _Recorder, _stats, _unbox

__all__ = ["backend", "decompositions", "stats", "reset_stats", "symbolic_fallbacks"]


def stats() -> dict[str, int]:
    """Counts of graphs seen by the backend (all, compiled natively, fallen
    back; ``graphs_from_cache``: those of them loaded from PyTorch's
    AOTAutograd cache instead of traced, see _output_code_classes) and of
    mutated graph inputs updated by compiled graphs: in place
    through buffer donation (``inputs_donated``), in place without donation
    because the storage was also passed as another input (``inputs_rebound``),
    or through a dense temporary and one copy, for non-dense views
    (``inputs_copied_back``). Graphs with symbolic shapes
    (compile_symbolic.py): ``bucketed_graphs`` (such graphs),
    ``bucket_modules`` (bounded-dynamic modules built, one per bucket key),
    ``exact_shape_graphs`` (of those graphs, the ones that run exact shapes,
    see symbolic_fallbacks()) and ``exact_shape_modules`` (their modules, one
    per concrete size)."""
    out = dict(_stats)
    out.update(_symbolic._stats)
    for k, v in _C._Graph.mutation_stats().items():
        out["inputs_" + k] = v
    return out


def symbolic_fallbacks() -> dict[str, int]:
    """Why graphs with symbolic shapes ran exact shapes (one module per
    concrete size) instead of one bounded-dynamic module per bucket: reason
    -> number of graphs (compile_symbolic.py)."""
    return _symbolic.fallbacks()


def reset_stats() -> None:
    """Zeroes :func:`stats`."""
    for k in _stats:
        _stats[k] = 0
    _symbolic.reset()
    _C._Graph.reset_mutation_stats()


_decompositions: dict | None = None


def decompositions() -> dict:
    """Core-ATen decompositions minus those of ops that have a lowering rule.

    The post-autograd core table, not ``core_aten_decompositions()``: that one
    adds an entry per CompositeImplicitAutograd op (which decompose in the
    dispatcher anyway when traced) and costs 0.1-0.3 s per process to
    materialize, on every warm start of a compiled model.
    """
    global _decompositions
    if _decompositions is None:
        from torch._decomp import _core_aten_decompositions_post_autograd

        table = dict(_core_aten_decompositions_post_autograd())
        for op in list(table):
            if isinstance(op, torch._ops.OpOverload) and _has_rule(_op_name(op)):
                del table[op]
        aten = torch.ops.aten
        if _has_rule("_scaled_dot_product_efficient_attention"):
            table[aten._scaled_dot_product_fused_attention_overrideable.default] = _sdpa_forward
        if _has_rule("_scaled_dot_product_efficient_attention_backward"):
            table[aten._scaled_dot_product_fused_attention_overrideable_backward.default] = _sdpa_backward
        _decompositions = table
    return _decompositions


# F.scaled_dot_product_attention on tpu picks the "overrideable" backend,
# whose eager kernels (csrc/aten/data_dependent.cpp) call the efficient
# attention ops that have lowering rules. The overrideable forward returns
# ints, which a graph cannot: these decompositions mirror those kernels so
# the graph holds the efficient attention ops instead.


def _sdpa_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                  return_debug_mask=False, scale=None):  # noqa: ANN001, ANN202
    three = query.dim() == 3
    q, k, v = (t.unsqueeze(0) if three else t for t in (query, key, value))
    out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, attn_bias, True, dropout_p, is_causal, scale=scale)
    L, S = q.size(2), k.size(2)
    lse = lse.narrow(2, 0, L)
    if three:
        out = out.squeeze(0)
    return out, lse, None, None, L, S, seed, offset, None


def _sdpa_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                   cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                   philox_offset, *, scale=None):  # noqa: ANN001, ANN202
    three = query.dim() == 3

    def four(t):  # noqa: ANN001, ANN202
        return t.unsqueeze(0) if three else t

    g, q, k, v, o = (four(t) for t in (grad_out, query, key, value, out))
    B, hq, hk = q.size(0), q.size(1), k.size(1)
    G = hq // hk if hk > 0 else 1
    ke, ve = k, v
    if G != 1:
        ke = k.unsqueeze(2).expand(B, hk, G, k.size(2), k.size(3)).reshape(B, hq, k.size(2), k.size(3))
        ve = v.unsqueeze(2).expand(B, hk, G, v.size(2), v.size(3)).reshape(B, hq, v.size(2), v.size(3))
    has_bias = attn_bias is not None
    bias = attn_bias if has_bias else torch.zeros(1, 1, 1, 1, dtype=q.dtype, device=q.device)
    dq, dk, dv, db = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        g, q, ke, ve, bias, o, logsumexp, philox_seed, philox_offset, dropout_p,
        [True, True, True, True], is_causal, scale=scale)
    if G != 1:
        dk = dk.reshape(B, hk, G, k.size(2), k.size(3)).sum(2)
        dv = dv.reshape(B, hk, G, v.size(2), v.size(3)).sum(2)
    if three:
        dq, dk, dv = dq.squeeze(0), dk.squeeze(0), dv.squeeze(0)
    dbias = db if has_bias and grad_input_mask[3] and attn_bias.is_floating_point() else None
    return dq, dk, dv, dbias


_SAVED_FIELDS = ("dense_from", "inputs_numbers", "device", "inputs", "outputs")


def _restore(state: dict) -> Any:
    """Unpickles a graph saved in the AOTAutograd cache (see
    _output_code_classes); its module is rebuilt when the cache uses it."""
    obj = object.__new__(_output_code_classes()[0])
    obj.__dict__.update({k: state[k] for k in _SAVED_FIELDS})
    obj._boxed_call = True
    obj.example_inputs = []
    obj.consts = {}
    obj.graph = None
    obj.calls = state["calls"]
    return obj


_output_codes: tuple[type, type] | None = None


def _output_code_classes() -> tuple[type, type]:
    """``_Compiled`` as an Inductor ``OutputCode``, which AOTAutograd's cache
    can save: what a compile traced (Dynamo's graph through AOTAutograd: the
    decompositions, functionalization, the forward/backward split, the
    runtime wrappers) is then stored on disk, and a later process that
    compiles the same graph skips that work. The module itself is saved as the
    recorded builder calls (replayed with the current lowering rules) and its
    executable as usual in torch_tpu's disk cache. The second class wraps a
    graph that runs eagerly (_fallback), which the cache declines to save.
    Created on first use: importing ``torch._inductor.output_code`` imports
    Dynamo."""
    global _output_codes
    if _output_codes is None:
        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
        from torch._inductor.output_code import OutputCode

        class _Code(OutputCode):
            # OutputCode declares these as dataclass fields; it is no dataclass.
            _fx_graph_cache_key = None
            _fx_graph_cache_debug_lines = None
            _time_taken_ns = None

            def set_triton_bundle(self, triton_bundle: Any) -> None:
                pass

        class _CompiledCode(_Compiled, _Code):
            def prepare_for_serialization(self) -> None:
                if any(kind != "arg" for kind, _ in self.inputs):
                    raise BypassAOTAutogradCache("torch_tpu: a graph with constant tensors")

            def post_compile(self, example_inputs: Any, constants: Any, graph_kwargs: Any) -> None:
                if self.graph is not None:
                    return
                # Loaded from the cache and used: rebuild the module with the
                # recorded calls; the executable comes from the disk cache.
                self.graph = _Recorder(_C._Graph())
                for name, args in self.__dict__.pop("calls"):
                    getattr(self.graph, name)(*args)
                self.graph.compile(self.device)
                _stats["graphs"] += 1
                _stats["native_graphs"] += 1
                _stats["graphs_from_cache"] += 1

            def __copy__(self) -> Any:
                new = object.__new__(type(self))
                new.__dict__.update(self.__dict__)
                return new

            def __reduce__(self) -> tuple:
                state = {k: getattr(self, k) for k in _SAVED_FIELDS}
                state["calls"] = self.graph.calls if self.graph is not None else self.calls
                return (_restore, (state,))

        class _EagerCode(_Code):
            _boxed_call = True

            def __init__(self, fn: Callable) -> None:
                self.fn = fn

            def __call__(self, *call_args: Any) -> Any:
                return self.fn(_unbox(call_args)[0])

            def prepare_for_serialization(self) -> None:
                raise BypassAOTAutogradCache("torch_tpu: a graph that runs eagerly")

            def post_compile(self, example_inputs: Any, constants: Any, graph_kwargs: Any) -> None:
                pass

        _Code.__module__ = _CompiledCode.__module__ = _EagerCode.__module__ = __name__
        _output_codes = (_CompiledCode, _EagerCode)
    return _output_codes


def _forward_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                   cacheable: bool = False) -> Callable:
    """The compiler of the forward graph of a training graph pair: its outputs
    from AOTAutograd's ``num_forward`` on are the tensors saved for backward."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    num_forward = getattr(meta, "num_forward", None)
    if num_forward is not None:
        num_forward += len(getattr(meta, "tokens", None) or ())  # effect tokens come first
    return _compile_graph(gm, example_inputs, num_forward, cacheable)


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                   dense_from: int | None = None, cacheable: bool = False) -> Callable:
    """The forward / backward / inference compiler given to AOTAutograd.
    ``cacheable``: return ``OutputCode`` objects (see _output_code_classes)."""
    _stats["graphs"] += 1
    compiled_cls, eager_cls = _output_code_classes() if cacheable else (_Compiled, None)
    symbolic = _symbolic.is_symbolic_graph(gm)
    if symbolic:
        # Built per bucket at call time; not saved by the AOTAutograd
        # cache (an _EagerCode declines to be saved).
        compiled, reason = _lower(lambda: _symbolic.Bucketed(gm, dense_from))
    else:
        compiled, reason = _lower(lambda: compiled_cls(gm, example_inputs, dense_from))
    if compiled is None:
        fallback = _fallback(gm, reason)
        return eager_cls(fallback) if cacheable else fallback
    _stats["native_graphs"] += 1
    if not symbolic:
        return compiled
    _symbolic.CREATED.append(compiled)
    return eager_cls(compiled) if cacheable else compiled


_backends: dict[bool, Callable] = {}


def _partition_kwargs() -> dict:
    """AOTAutograd's min-cut partitioner (as Inductor uses): the forward graph
    saves fewer tensors for backward and the backward graph recomputes cheap
    ones (views, transposes of weights, elementwise ops) instead of reading
    them (the Llama train step of benchmarks/llama_modes.py: about 10-20%
    faster than with the default partitioner on XLA:CPU).
    TORCH_TPU_COMPILE_PARTITION=default turns it off."""
    import os

    if os.environ.get("TORCH_TPU_COMPILE_PARTITION", "min_cut") == "default":
        return {}
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return {"partition_fn": min_cut_rematerialization_partition}


def _cache_traces() -> bool:
    """Whether compiled graphs go through PyTorch's AOTAutograd cache: when
    torch_tpu's disk cache is on (``TORCH_TPU_CACHE_DIR`` not "") and
    PyTorch's is (``TORCHINDUCTOR_AUTOGRAD_CACHE``, ``force_disable_caches``)."""
    import os

    if os.environ.get("TORCH_TPU_CACHE_DIR") == "":
        return False
    from torch._functorch._aot_autograd.autograd_cache import should_use_local_autograd_cache

    from .cache_safety import trace_cache_is_safe  # refuses a directory others can write

    return should_use_local_autograd_cache() and trace_cache_is_safe()


_salt: str | None = None


def _cache_salt() -> str:
    """What the AOTAutograd cache key must also cover, besides the graph,
    its inputs and PyTorch's configuration: the native library (its rules
    decide which ops are decomposed; the build identity that also names the
    prefetch manifests), this lowering code (compile_graph.py) and this
    module, and the partitioner choice."""
    global _salt
    if _salt is None:
        import hashlib
        import os

        h = hashlib.sha256(_C._build_identity().encode() + b"\n")
        for path in (__file__, os.path.join(os.path.dirname(__file__), "compile_graph.py")):
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(os.environ.get("TORCH_TPU_COMPILE_PARTITION", "min_cut").encode())
        _salt = h.hexdigest()
    return _salt


def _aot_backend(cacheable: bool) -> Callable:
    fn = _backends.get(cacheable)
    if fn is None:
        import functools

        from torch._dynamo.backends.common import aot_autograd

        fw = functools.partial(_forward_graph, cacheable=cacheable)
        other = functools.partial(_compile_graph, cacheable=cacheable)
        if cacheable:
            from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

            fw = SerializableAOTDispatchCompiler(_output_code_classes()[0], fw)
            other = SerializableAOTDispatchCompiler(_output_code_classes()[0], other)
        fn = _backends[cacheable] = aot_autograd(
            fw_compiler=fw,
            bw_compiler=other,
            inference_compiler=other,
            decompositions=decompositions(),
            # In-place updates of inputs stay in the graph (copy_ epilogue),
            # done through buffer donation instead of copies.
            keep_inference_input_mutations=True,
            **_partition_kwargs(),
        )
    return fn


def _compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable:
    """AOTAutograd with our compilers; through PyTorch's AOTAutograd cache
    when _cache_traces() (bundled entries: the cache holds our OutputCode)."""
    if not _cache_traces():
        return _aot_backend(False)(gm, example_inputs, **kwargs)
    gm._torch_tpu_cache_salt = _cache_salt()  # part of the cache key (gm.__dict__)
    # The backward graph is compiled with the forward (not lazily at the
    # first backward), so that the pair is saved while these settings hold.
    with torch._functorch.config.patch(bundled_autograd_cache=True,
                                       force_non_lazy_backward_lowering=True):
        return _aot_backend(True)(gm, example_inputs, **kwargs)


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable:
    """The Dynamo backend registered as "tpu". A graph with symbolic shapes
    is traced once, symbolically, and runs one bounded-dynamic module per
    size bucket (compile_symbolic.py); TORCH_TPU_COMPILE_SYMBOLIC=0 (or a
    failed symbolic trace) compiles it once per concrete input signature
    instead (_Specializing)."""
    import os

    if any(_is_symbolic(a) for a in example_inputs):
        if os.environ.get("TORCH_TPU_COMPILE_SYMBOLIC", "1") == "0":
            return _Specializing(gm)
        try:
            created = _symbolic.CREATED
            created.clear()
            compiled = _compile(gm, example_inputs, **kwargs)
            return _SymbolicOrSpecializing(gm, compiled, list(created))
        except torch._dynamo.exc.RestartAnalysis:
            # Dynamo's own signal, not a failure: it retraces the frame (e.g.
            # with a float it had made a graph input specialized again).
            raise
        except Exception as e:  # noqa: BLE001  (AOTAutograd raises many types)
            warnings.warn(f"torch_tpu: torch.compile(backend='tpu') could not trace a graph "
                          f"symbolically ({type(e).__name__}: {str(e)[:200]}); it compiles per input "
                          f"shape instead", stacklevel=2)
            _symbolic._count_exact(f"symbolic trace failed: {type(e).__name__}")
            return _Specializing(gm)
    return _compile(gm, example_inputs, **kwargs)


class _SymbolicOrSpecializing:
    """A symbolically traced graph (its Bucketed forward / backward), until
    one of them cannot be lowered even at exact shapes from the symbolic
    graph (that call ran eagerly): then compiled once per concrete input
    signature as before (_Specializing, which retraces with concrete sizes)."""

    def __init__(self, gm: torch.fx.GraphModule, compiled: Callable, bucketed: list) -> None:
        self.gm, self.compiled, self.bucketed = gm, compiled, bucketed
        self.specializing: _Specializing | None = None

    def __call__(self, *args: Any) -> Any:
        if self.specializing is not None:
            return self.specializing(*args)
        out = self.compiled(*args)
        if any(b.eager is not None for b in self.bucketed):
            self.specializing = _Specializing(self.gm)
        return out


def _is_symbolic(a: Any) -> bool:
    if isinstance(a, torch.SymInt):
        return True
    return isinstance(a, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in a.shape)


class _Specializing:
    """A graph Dynamo made shape-dynamic (its automatic dynamic shapes, on the
    second input shape): compiled once per concrete input signature, i.e.
    static shapes (``dynamic=False`` semantics) as the device wants."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.cache: dict[tuple, Callable] = {}
        # Inputs Dynamo made of Python floats (``dynamic=True``: an epsilon, a
        # scaling factor as a 0-d tensor) that the graph reads back with
        # .item(): a trace with concrete sizes cannot read a fake tensor's
        # value, so each such read is specialized to the call's value.
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.item_reads = [(i, n) for i, p in enumerate(placeholders) for n in p.users
                           if n.op == "call_method" and n.target == "item"]

    def __call__(self, *args: Any) -> Any:
        items = tuple(args[i].item() for i, _ in self.item_reads)
        key = tuple(
            (tuple(a.shape), a.dtype, str(a.device), a.requires_grad) if isinstance(a, torch.Tensor) else (type(a), a)
            for a in args
        ) + items
        fn = self.cache.get(key)
        if fn is None:
            fn = self.cache[key] = _compile(self._with_items(items), list(args))
        return fn(*args)

    def _with_items(self, values: tuple) -> torch.fx.GraphModule:
        """The graph with each .item() read of an input replaced by its value."""
        if not values:
            return self.gm
        gm = copy.deepcopy(self.gm)
        nodes = {n.name: n for n in gm.graph.nodes}
        for (_, read), value in zip(self.item_reads, values):
            node = nodes[read.name]
            node.replace_all_uses_with(value)  # type: ignore[arg-type]  (FX takes constants)
            gm.graph.erase_node(node)
        gm.recompile()
        return gm


def _has_tpu_tensor(example_inputs: Sequence[Any]) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in example_inputs)


def _route_inductor() -> None:
    """Plain ``torch.compile(model)`` (Inductor) on tpu tensors runs through "tpu".

    Inductor has no code generator for the "tpu" device (it fails deep in its
    scheduler, trying Pallas/JAX). Graphs whose inputs live on tpu are
    therefore compiled by this backend instead; Inductor's own options (mode,
    options=...) do not apply to them. Graphs on other devices go to Inductor
    unchanged.
    """
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_torch_tpu_routed", False):
        return
    original = wrapper.__call__

    def __call__(self: Any, model_: torch.fx.GraphModule, inputs_: Sequence[Any]) -> Callable:
        if _has_tpu_tensor(inputs_):
            return backend(model_, inputs_)
        return original(self, model_, inputs_)

    __call__._torch_tpu_routed = True  # type: ignore[attr-defined]
    wrapper.__call__ = __call__


_REGISTRY = "torch._dynamo.backends.registry"


def _register(registry: Any) -> None:
    """Registers the "tpu" backend with Dynamo."""
    if "tpu" not in registry._COMPILER_FNS:
        registry.register_backend(name="tpu")(backend)


class _RegistryHook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Registers the backend right after Dynamo's registry module executes.

    Importing Dynamo costs about a second, so ``import torch`` must not do
    it; this hook waits until a program imports Dynamo (torch.compile does).
    """

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _REGISTRY:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _register(module)


def _install() -> None:
    _route_inductor()
    if _REGISTRY in sys.modules:
        _register(sys.modules[_REGISTRY])
    else:
        sys.meta_path.insert(0, _RegistryHook())


_install()
