"""Finds the PJRT plugin to load: TORCH_TPU_PLUGIN=cpu|cuda|tpu|/path/to/plugin.so.

Default: libtpu when a TPU is present, else the XLA:CPU plugin of the
installed ``xla-cpu-pjrt`` wheel.
"""
from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os


class PluginNotFoundError(RuntimeError):
    """No PJRT plugin could be located for the requested platform."""


def _package_dir(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _cpu_plugin() -> str:
    d = _package_dir("xla_plugins.xla_cpu_pjrt")
    if d and os.path.exists(os.path.join(d, "xla_cpu_pjrt.so")):
        return os.path.join(d, "xla_cpu_pjrt.so")
    raise PluginNotFoundError(
        "torch_tpu: the XLA:CPU PJRT plugin is not installed: pip install xla-cpu-pjrt"
    )


def _dist_files(dist: str, pattern: str) -> list[str]:
    """Files of an installed distribution matching a glob, without importing it."""
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for f in files:
        if glob.fnmatch.fnmatch(str(f), pattern):
            out.append(str(f.locate()))
    return out


def _cuda_plugin() -> str:
    for dist, pattern in (
        ("xla-cuda13-pjrt", "*xla_gpu_pjrt.so"),
        ("jax-cuda13-pjrt", "*xla_cuda_plugin.so"),
        ("jax-cuda12-pjrt", "*xla_cuda_plugin.so"),
    ):
        for path in _dist_files(dist, pattern):
            if os.path.exists(path):
                return path
    raise PluginNotFoundError(
        "torch_tpu: TORCH_TPU_PLUGIN=cuda but no CUDA PJRT plugin is installed: "
        "pip install jax-cuda13-pjrt (or xla-cuda13-pjrt)"
    )


def _tpu_plugin() -> str | None:
    path = os.environ.get("TPU_LIBRARY_PATH")
    if path and os.path.exists(path):
        return path
    try:
        import libtpu  # type: ignore

        return libtpu.get_library_path()
    except Exception:
        return None


def _tpu_present() -> bool:
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def resolve() -> str:
    """Path of the plugin selected by TORCH_TPU_PLUGIN (or the default)."""
    choice = os.environ.get("TORCH_TPU_PLUGIN", "").strip()
    if choice in ("", "auto"):
        if _tpu_present():
            tpu = _tpu_plugin()
            if tpu:
                return tpu
        return _cpu_plugin()
    if choice == "cpu":
        return _cpu_plugin()
    if choice in ("cuda", "gpu"):
        return _cuda_plugin()
    if choice == "tpu":
        tpu = _tpu_plugin()
        if not tpu:
            raise PluginNotFoundError(
                "torch_tpu: TORCH_TPU_PLUGIN=tpu but libtpu is not installed (pip install libtpu) "
                "and TPU_LIBRARY_PATH is not set"
            )
        return tpu
    # Anything else is a path; a bad one is reported when the plugin loads.
    return choice
