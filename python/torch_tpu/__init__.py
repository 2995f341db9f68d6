"""torch_tpu: PyTorch's "tpu" device, native (PrivateUse1) over PJRT.

Importing torch is enough: the ``torch.backends`` entry point loads this
package, which names the PrivateUse1 backend "tpu", registers ``torch.tpu``
and ``torch.backends.tpu``, and configures the PJRT plugin (loaded lazily on
first use).
"""
from __future__ import annotations


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group (runs on ``import torch``).

    Defined before ``import torch``: when ``import torch_tpu`` comes first,
    torch's autoload finds this module half-initialized and calls this; the
    module's own body then finishes the setup.
    """
    setup = globals().get("_setup")
    if setup is not None:
        setup()


import atexit
import os
import sys
import time
import types

import torch

from . import _plugin

_initialized = False


def _finish_queued_launches() -> None:
    """At exit: runs the launches still queued behind background compiles
    (TORCH_TPU_COMPILE_THREADS), so no compile is left inside XLA while the
    process tears down; a failure is reported, not raised."""
    try:
        _C._flush()
    except Exception as e:  # noqa: BLE001  (exit must go on)
        print(f"torch_tpu: at exit: {e}", file=sys.stderr)


def _setup() -> None:
    global _initialized
    if _initialized:
        return
    _initialized = True
    # XLA's informational logging (one line per client) is noise for users.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from . import _C  # noqa: F401  (loads the kernels)

    torch.utils.rename_privateuse1_backend("tpu")
    try:
        plugin = _plugin.resolve()
    except _plugin.PluginNotFoundError as e:
        plugin = ""
    cpu_devices = int(os.environ.get("TORCH_TPU_CPU_DEVICES", "1"))
    if cpu_devices < 1:
        raise ValueError("TORCH_TPU_CPU_DEVICES must be >= 1")
    _C._configure(plugin, cpu_devices)
    _C._register()
    atexit.register(_release_autograd_threads)
    atexit.register(_finish_queued_launches)  # runs first (atexit is LIFO)

    from . import device as _device_module

    torch._register_device_module("tpu", _device_module)
    sys.modules["torch.tpu.pallas"] = _device_module.pallas  # `from torch.tpu.pallas import jax_op`
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    backends = types.ModuleType("torch.backends.tpu")
    backends.__doc__ = "torch_tpu backend flags (mirrors torch.backends.cuda where it applies)."
    backends.is_built = lambda: True  # type: ignore[attr-defined]
    backends.is_available = _device_module.is_available  # type: ignore[attr-defined]
    sys.modules["torch.backends.tpu"] = backends
    torch.backends.tpu = backends  # type: ignore[attr-defined]
    # torch.profiler records tpu device, compile and transfer spans;
    # torch.tpu.profiler is torch_tpu.profiler.
    from . import profiler as _profiler

    _profiler.install()
    _device_module.profiler = _profiler  # type: ignore[attr-defined]


def _release_autograd_threads() -> None:
    """Lets autograd's tpu device thread drop its last graph task.

    Every backward() stashes a Python object in the graph task; the device
    thread may hold the last reference a moment after backward() returns.
    If the interpreter is already finalizing when it releases it, taking the
    GIL kills the thread and the process aborts. Releasing the GIL briefly
    at exit lets it finish first.
    """
    time.sleep(0.02)


_setup()

from . import debug  # noqa: E402
from . import dynamic  # noqa: E402,F401  (bounded dynamic shapes: mode, set_mode)
from .dynamic import mark_dynamic, mark_static  # noqa: E402,F401
from . import compile_log as _compile_log  # noqa: E402

_compile_log.install()  # one warning per slow burst of compiles (compile_log.py)
from . import compile  # noqa: E402,F401  (torch.compile backend "tpu", registered lazily)
from . import hf as _hf  # noqa: E402,F401  (Hugging Face import hooks; imports no HF library)
from . import distributed as _distributed  # noqa: E402

# torch.distributed on tpu tensors: the "tpu_gloo" backend and the routing of
# init_process_group("gloo") / init_process_group() to it (see distributed.py).
_distributed._install()
from . import meta_fixes as _meta_fixes  # noqa: E402

_meta_fixes.install()  # PyTorch meta kernels that tpu ops reach (see meta_fixes.py)
from .device import get_platform  # noqa: E402,F401
from .fusion import fused  # noqa: E402
from . import pallas  # noqa: E402,F401  (torch_tpu.pallas.jax_op)

__all__ = ["debug", "fused", "get_platform", "mark_dynamic", "mark_static", "pallas"]
