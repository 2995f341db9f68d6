"""Hugging Face glue for the "tpu" device, applied at import time.

Users change nothing in their code except the device string. Importing torch
(which autoloads torch_tpu) calls :func:`install`, which does NOT import any
Hugging Face library: it only adds a tiny import hook to ``sys.meta_path``.
When (and only when) a program later imports one of the libraries below, the
hook patches that module right after it finished executing; a library that
was imported before torch_tpu is patched at once. ``TORCH_TPU_HF_GLUE=0``
turns all of this off.

What is patched, and why:

``safetensors`` (``safe_open``, hence ``safetensors.torch.load_file``)
    The Rust loader accepts only the devices it knows (cpu, cuda, mps, xpu,
    npu, ...) and raises ``SafetensorError: device tpu is invalid``. For a
    "tpu" device (``"tpu"``, ``"tpu:0"``, ``torch.device("tpu")``) the file is
    opened on CPU (memory-mapped, as usual) and every tensor read from it is
    moved to the device; ``get_slice`` slices are moved too. Any other device
    goes to the original loader untouched (the original object is returned).

``transformers.modeling_utils.PreTrainedModel.get_compiled_call``
    ``generate()`` auto-compiles the forward pass when the cache is
    compileable (``cache_implementation="static"``) on "tpu", with
    ``torch.compile(backend="tpu")``. Until torch_tpu registers that
    TorchDynamo backend, ``torch.compile`` would raise ``InvalidBackend``.
    When the requested backend is not registered and the model is on "tpu",
    the eager forward is used instead, with ONE ``UserWarning`` per process.
    Once a "tpu" backend is registered the original method runs; if that
    backend then fails to compile the graph (``BackendCompilerFailed``, raised
    before anything runs), the model runs eagerly from then on, again with a
    single warning. Transformers' default config there says ``dynamic=False``
    (one graph per batch size and cache length); unless
    ``TORCH_TPU_DYNAMIC_SHAPES=0`` it becomes ``dynamic=None``: Dynamo's
    automatic dynamic shapes, one bounded module per size bucket. A
    ``compile_config`` the user gives is left as it is.

``transformers.generation.utils.GenerationMixin._prepare_static_cache``
    The StaticCache that ``generate()`` creates is sized to this call's
    ``max_length`` (prompt + new tokens), so every longer prompt made a new
    cache shape: a new compiled decode graph and new eager prefill ops. On
    "tpu", unless ``TORCH_TPU_DYNAMIC_SHAPES=0``, its length is rounded up to
    strict eager's size bucket (4, 8, 16, then 8 buckets per octave: < 12.5%
    more cache above 16), so the prompts of one bucket share one cache shape
    and compile nothing new. Positions past the prompt are masked, so tokens
    are unchanged. A ``max_cache_len`` in the generation config is rounded
    the same way (every call then shares its shape); a cache object the user
    passes is left as it is.

``accelerate.state.PartialState.default_device``
    Accelerate knows cuda, xpu, npu, mps, ... but not "tpu": its default
    device would be CPU while Transformers' ``TrainingArguments.device`` is
    ``tpu:0``, so ``Trainer`` moved the model back to CPU and the batches to
    "tpu". Where Accelerate would answer CPU (and was not told ``cpu=True``),
    it answers "tpu" when torch_tpu is the current accelerator.

Transformers >= 5.2x already recognises the device itself
(``transformers.utils.is_torch_tpu_available()`` reads the current
accelerator, which is "tpu" once torch_tpu is loaded), and
``from_pretrained(..., device_map="tpu")`` reads safetensors on CPU and moves
the weights, so nothing else needs patching for it.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
import warnings
from typing import Any, Callable, Dict

__all__ = ["install", "is_tpu_device", "COMPILE_FALLBACK_WARNING"]

COMPILE_FALLBACK_WARNING = (
    "torch_tpu: generate() asked for torch.compile(backend={backend!r}) on the 'tpu' device, "
    "but no TorchDynamo backend of that name is registered yet; running the model eagerly "
    "instead (same results, no graph compilation). Pass disable_compile=True to generate() "
    "to silence this warning."
)

COMPILE_FAILED_WARNING = (
    "torch_tpu: generate() auto-compiles the model with torch.compile(backend={backend!r}) on the "
    "'tpu' device, and the backend failed to compile it ({reason}); running the model eagerly "
    "instead (same results). Pass disable_compile=True to generate() to silence this warning."
)

_lock = threading.Lock()
_patched: set = set()
_warned_compile = False


def is_tpu_device(device: Any) -> bool:
    """True for "tpu", "tpu:N" and torch.device("tpu"[, N])."""
    if isinstance(device, str):
        return device == "tpu" or device.startswith("tpu:")
    dtype = getattr(device, "type", None)
    return dtype == "tpu" and type(device).__name__ == "device"


# --------------------------------------------------------------------------
# safetensors


class _TpuSlice:
    """A safetensors slice read on CPU whose results land on the device."""

    def __init__(self, inner: Any, device: Any) -> None:
        self._inner = inner
        self._device = device

    def __getitem__(self, item: Any) -> Any:
        return _to_device(self._inner[item], self._device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _to_device(value: Any, device: Any) -> Any:
    to = getattr(value, "to", None)
    return to(device) if to is not None else value


class _TpuSafeOpen:
    """Proxy for safetensors' ``safe_open`` opened on CPU for a tpu device."""

    def __init__(self, inner: Any, device: Any) -> None:
        self._inner = inner
        self._device = device

    def __enter__(self) -> "_TpuSafeOpen":
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._inner.__exit__(*exc)

    def get_tensor(self, name: str) -> Any:
        return _to_device(self._inner.get_tensor(name), self._device)

    def get_tensors(self) -> Dict[str, Any]:
        if hasattr(self._inner, "get_tensors"):
            tensors = self._inner.get_tensors()
        else:
            tensors = {k: self._inner.get_tensor(k) for k in self._inner.keys()}
        return {k: _to_device(v, self._device) for k, v in tensors.items()}

    def get_slice(self, name: str) -> _TpuSlice:
        return _TpuSlice(self._inner.get_slice(name), self._device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _wrap_safe_open(original: Callable) -> Callable:
    if getattr(original, "_torch_tpu_wrapped", False):
        return original

    def safe_open(filename: Any, framework: Any, device: Any = "cpu", *args: Any, **kwargs: Any) -> Any:
        if framework in ("pt", "torch", "pytorch") and is_tpu_device(device):
            import torch

            inner = original(filename, framework, "cpu", *args, **kwargs)
            return _TpuSafeOpen(inner, torch.device(device))
        return original(filename, framework, device, *args, **kwargs)

    safe_open.__doc__ = (original.__doc__ or "") + (
        "\n\n(torch_tpu: a 'tpu' device is opened on CPU and tensors are moved to the device.)"
    )
    safe_open._torch_tpu_wrapped = True  # type: ignore[attr-defined]
    safe_open._torch_tpu_original = original  # type: ignore[attr-defined]
    return safe_open


def _patch_safetensors(module: Any) -> None:
    original = getattr(module, "safe_open", None)
    if original is None:
        return
    module.safe_open = _wrap_safe_open(original)
    # safetensors.torch took its own reference if it was imported already.
    sub = sys.modules.get("safetensors.torch")
    if sub is not None and hasattr(sub, "safe_open"):
        sub.safe_open = _wrap_safe_open(sub.safe_open)


def _patch_safetensors_torch(module: Any) -> None:
    if hasattr(module, "safe_open"):
        module.safe_open = _wrap_safe_open(module.safe_open)


# --------------------------------------------------------------------------
# transformers


def _backend_registered(backend: Any) -> bool:
    if not isinstance(backend, str):
        return True  # a callable backend: the caller's business
    try:
        from torch._dynamo.backends.registry import lookup_backend

        lookup_backend(backend)
        return True
    except Exception:
        return False


def _eager_on_compiler_failure(model: Any, compiled: Callable, backend: Any) -> Callable:
    """Runs ``compiled``; if the backend fails to compile the graph, runs eagerly from then on.

    Only ``BackendCompilerFailed`` is caught: it is raised while compiling, before the graph
    runs, so nothing (e.g. a static cache) was mutated yet.
    """
    import torch._dynamo.exc as dynamo_exc

    def call(*args: Any, **kwargs: Any) -> Any:
        global _warned_compile
        if getattr(model, "_torch_tpu_compile_failed", False):
            return model.__call__(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except dynamo_exc.BackendCompilerFailed as e:
            model._torch_tpu_compile_failed = True
            if not _warned_compile:
                _warned_compile = True
                inner = getattr(e, "inner_exception", None) or e
                reason = f"{type(inner).__name__}: {inner}"[:300]
                name = backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))
                warnings.warn(
                    COMPILE_FAILED_WARNING.format(backend=name, reason=reason),
                    UserWarning,
                    stacklevel=2,
                )
            return model.__call__(*args, **kwargs)

    return call


def _patch_modeling_utils(module: Any) -> None:
    cls = getattr(module, "PreTrainedModel", None)
    original = getattr(cls, "get_compiled_call", None) if cls is not None else None
    if original is None or getattr(original, "_torch_tpu_wrapped", False):
        return

    def get_compiled_call(self: Any, compile_config: Any = None) -> Callable:
        global _warned_compile
        device = getattr(self, "device", None)
        if getattr(device, "type", None) == "tpu":
            config = compile_config
            if config is None:
                config = getattr(getattr(self, "generation_config", None), "compile_config", None)
            if config is None and hasattr(self, "_default_compile_config"):
                config = compile_config = _automatic_dynamic(self._default_compile_config())
            backend = getattr(config, "backend", "tpu")
            if not _backend_registered(backend):
                if not _warned_compile:
                    _warned_compile = True
                    warnings.warn(COMPILE_FALLBACK_WARNING.format(backend=backend), UserWarning, stacklevel=3)
                return self.__call__
            if getattr(self, "_torch_tpu_compile_failed", False):
                return self.__call__
            return _eager_on_compiler_failure(self, original(self, compile_config), backend)
        return original(self, compile_config)

    get_compiled_call.__doc__ = original.__doc__
    get_compiled_call.__wrapped__ = original  # type: ignore[attr-defined]
    get_compiled_call._torch_tpu_wrapped = True  # type: ignore[attr-defined]
    cls.get_compiled_call = get_compiled_call


def _automatic_dynamic(config: Any) -> Any:
    """Transformers' default compile config on "tpu" with ``dynamic=None``
    instead of ``False`` (unless ``TORCH_TPU_DYNAMIC_SHAPES=0``): a decode
    step that meets a new batch size or cache length is traced once more with
    those dims symbolic (Dynamo's automatic dynamic shapes), and runs on one
    bounded-dynamic module per size bucket (compile_symbolic.py) instead of
    one graph per shape."""
    from . import _C  # noqa: PLC0415 (loaded by then: the model is on "tpu")

    if _C._dynamic_shapes() != "0" and getattr(config, "dynamic", None) is False:
        config.dynamic = None
    return config


def _bucketed_cache_length(model: Any, length: int) -> int:
    """`length` rounded up to strict eager's size bucket for a model on "tpu"."""
    if getattr(getattr(model, "device", None), "type", None) != "tpu":
        return length
    from . import _C  # noqa: PLC0415 (the extension is loaded by then: the model is on "tpu")

    if _C._dynamic_shapes() == "0":
        return length
    from .dynamic import bucket  # noqa: PLC0415

    return bucket(int(length))  # an int-like length (numpy) as before


def _patch_generation_utils(module: Any) -> None:
    cls = getattr(module, "GenerationMixin", None)
    original = getattr(cls, "_prepare_static_cache", None) if cls is not None else None
    if original is None or getattr(original, "_torch_tpu_wrapped", False):
        return

    def _prepare_static_cache(self: Any, cache_implementation: str, batch_size: int, max_cache_len: int,
                              *args: Any, **kwargs: Any) -> Any:
        length = _bucketed_cache_length(self, max_cache_len)
        return original(self, cache_implementation, batch_size, length, *args, **kwargs)

    _prepare_static_cache.__doc__ = original.__doc__
    _prepare_static_cache.__wrapped__ = original  # type: ignore[attr-defined]
    _prepare_static_cache._torch_tpu_wrapped = True  # type: ignore[attr-defined]
    cls._prepare_static_cache = _prepare_static_cache


def _patch_accelerate_state(module: Any) -> None:
    cls = getattr(module, "PartialState", None)
    prop = cls.__dict__.get("default_device") if cls is not None else None
    if not isinstance(prop, property) or getattr(prop.fget, "_torch_tpu_wrapped", False):
        return
    original = prop.fget

    def default_device(self: Any) -> Any:
        device = original(self)
        if getattr(device, "type", None) == "cpu":
            import torch

            tpu = getattr(torch, "tpu", None)
            if tpu is not None and torch._C._get_accelerator().type == "tpu" and tpu.is_available():
                return torch.device("tpu", tpu.current_device())
        return device

    default_device.__doc__ = (original.__doc__ or "") + "\n        (torch_tpu: 'tpu' when available, before CPU.)"
    default_device._torch_tpu_wrapped = True  # type: ignore[attr-defined]
    cls.default_device = property(default_device)


_PATCHES: Dict[str, Callable[[Any], None]] = {
    "accelerate.state": _patch_accelerate_state,
    "safetensors": _patch_safetensors,
    "safetensors.torch": _patch_safetensors_torch,
    "transformers.generation.utils": _patch_generation_utils,
    "transformers.modeling_utils": _patch_modeling_utils,
}


def _apply(name: str, module: Any) -> None:
    with _lock:
        if name in _patched:
            return
        _patched.add(name)
    try:
        _PATCHES[name](module)
    except Exception as e:  # never break the user's import
        warnings.warn(f"torch_tpu: could not patch {name} for the 'tpu' device: {e!r}", RuntimeWarning)


# --------------------------------------------------------------------------
# import hook


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _apply(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Patches the modules in _PATCHES right after they are first executed."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _PATCHES or fullname in _patched or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


_hook: _ImportHook | None = None


def install() -> None:
    """Installs the import hook (idempotent); patches what is already imported."""
    global _hook
    if os.environ.get("TORCH_TPU_HF_GLUE", "1") == "0":
        return
    if _hook is None:
        _hook = _ImportHook()
        sys.meta_path.insert(0, _hook)
    for name in _PATCHES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None:
            _apply(name, module)


install()
