"""``torch.tpu``: the device module, mirroring ``torch.cuda``."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Union

import torch

from . import _C
from . import pallas  # noqa: F401  (torch.tpu.pallas.jax_op; imports JAX only when used)

_DeviceLike = Union[int, str, torch.device, None]


def _index(device: _DeviceLike = None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "tpu":
        raise ValueError(f"Expected a tpu device, got {d}")
    return current_device() if d.index is None else d.index


def is_available() -> bool:
    """Whether a PJRT plugin loads and reports at least one device."""
    try:
        return _C._device_count() > 0
    except RuntimeError:
        return False


def is_initialized() -> bool:
    """Whether the PJRT client has been created."""
    return _C._is_initialized()


def init() -> None:
    """Loads the plugin and creates the client now (otherwise on first use)."""
    _C._device_count()


def device_count() -> int:
    """Number of tpu devices (for XLA:CPU: TORCH_TPU_CPU_DEVICES, default 1)."""
    try:
        return _C._device_count()
    except RuntimeError:
        return 0


def current_device() -> int:
    return _C._current_device()


def set_device(device: _DeviceLike) -> None:
    _C._set_device(_index(device))


class device:
    """Context manager that changes the current tpu device."""

    def __init__(self, device: _DeviceLike):
        self.idx = _index(device) if device is not None else -1
        self.prev = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            self.prev = current_device()
            set_device(self.idx)

    def __exit__(self, *exc: Any) -> None:
        if self.prev >= 0:
            set_device(self.prev)


class device_of(device):
    """Context manager that makes the device of ``obj`` current."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else None)


def synchronize(device: _DeviceLike = None) -> None:
    """Waits for all work issued so far on the device."""
    _C._synchronize(_index(device))


def get_platform() -> str:
    """The plugin that runs: "cpu", "cuda" or "tpu"."""
    return _C._platform()


def get_device_name(device: _DeviceLike = None) -> str:
    idx = _index(device)
    return f"{_C._platform()}:{_C._device_kind(idx)}"


class _DeviceProperties:
    def __init__(self, idx: int):
        self.name = get_device_name(idx)
        self.platform = _C._platform()
        self.platform_version = _C._platform_version()
        self.index = idx
        self.total_memory = 0  # not reported by every plugin

    def __repr__(self) -> str:
        return f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}')"


def get_device_properties(device: _DeviceLike = None) -> _DeviceProperties:
    return _DeviceProperties(_index(device))


def get_device_capability(device: _DeviceLike = None) -> tuple[int, int]:
    return (0, 0)


# ---- RNG

class _DefaultGenerators:
    """``torch.tpu.default_generators[i]``: the default generator of tpu:i."""

    def __getitem__(self, idx: int) -> torch.Generator:
        return _rng(idx)

    def __len__(self) -> int:
        return device_count()


default_generators = _DefaultGenerators()


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    _rng(current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _rng(i).manual_seed(int(seed))


def seed() -> None:
    _rng(current_device()).seed()


def seed_all() -> None:
    for i in range(device_count()):
        _rng(i).seed()


def initial_seed() -> int:
    return _rng(current_device()).initial_seed()


def get_rng_state(device: _DeviceLike = None) -> torch.Tensor:
    return _rng(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = None) -> None:
    _rng(_index(device)).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


def _rng(idx: int) -> torch.Generator:
    return _C._default_generator(idx)


# ---- memory

def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes held by live tpu storages on the device."""
    return _C._memory(_index(device))["allocated_bytes"]


def max_memory_allocated(device: _DeviceLike = None) -> int:
    return _C._memory(_index(device))["peak_allocated_bytes"]


def memory_reserved(device: _DeviceLike = None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _C._reset_peak(_index(device))


def memory_stats(device: _DeviceLike = None) -> dict[str, int]:
    """``torch.cuda.memory_stats``'s keys where they mean the same here.

    Storages own their device buffers and free them when released (no
    caching allocator), so reserved, active and requested bytes all equal
    allocated bytes; ``allocation.*`` count storage buffers. Keys CUDA has
    that torch_tpu does not track (cumulative bytes, pools, segments,
    retries, OOMs) are left out rather than reported as 0.
    """
    m = _C._memory(_index(device))
    current, peak = m["allocated_bytes"], m["peak_allocated_bytes"]
    stats = {"allocation.all.current": m["num_allocs"] - m["num_frees"],
             "allocation.all.allocated": m["num_allocs"],
             "allocation.all.freed": m["num_frees"]}
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
        stats[f"{name}.all.current"] = current
        stats[f"{name}.all.peak"] = peak
    return dict(sorted(stats.items()))  # CUDA's order: sorted by key


def empty_cache() -> None:
    """Storages free their device buffers when released: nothing is cached."""
    synchronize()


def mem_get_info(device: _DeviceLike = None) -> tuple[int, int]:
    return (0, 0)


# ---- streams and events

class Stream(torch.Stream):
    """The device's in-order stream (each device has one)."""

    def __new__(cls, device: _DeviceLike = None, priority: int = 0, **kwargs: Any):
        return super().__new__(cls, device=torch.device("tpu", _index(device)), priority=priority)

    def synchronize(self) -> None:
        synchronize(self.device_index)

    def wait_stream(self, stream: "Stream") -> None:
        pass  # single in-order stream per device

    def wait_event(self, event: "Event") -> None:
        pass

    def query(self) -> bool:
        return True


class Event(torch.Event):
    """Timing event; record() waits for the work issued before it."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, device=torch.device("tpu", current_device()),
                               enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds between this event and ``end_event`` (both recorded)."""
        return _C._event_elapsed_time(self, end_event)


def current_stream(device: _DeviceLike = None) -> Stream:
    return Stream(device)


def _record_stream(self: torch.Tensor, stream: torch.Stream) -> None:
    """``Tensor.record_stream`` on "tpu": nothing to record.

    CUDA needs it so its caching allocator does not reuse a block while
    another stream may still use it; here each device has one in-order stream
    and PJRT buffers are reference-counted, so a buffer is never reused early.
    Without a kernel the op fell back to CPU, which has none either
    (diffusers' group offloading calls it with ``record_stream=True``).
    """
    if stream.device.type != self.device.type:
        raise RuntimeError(f"record_stream: stream on {stream.device}, tensor on {self.device}")


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("record_stream", _record_stream, "PrivateUse1")


def default_stream(device: _DeviceLike = None) -> Stream:
    return Stream(device)


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    yield


def set_stream(s: Stream) -> None:
    pass


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes torch.autocast(device_type="tpu", dtype=...) accepts."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def _is_in_bad_fork() -> bool:
    """Whether this process is a fork of one that used the tpu device (then
    the device cannot be used here; torch.manual_seed skips it, as for CUDA)."""
    return bool(_C._is_in_bad_fork())


def _lazy_init() -> None:
    init()
