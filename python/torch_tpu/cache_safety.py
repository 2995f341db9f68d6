"""Refusing cache directories that another user could write.

torch_tpu's caches hold what is loaded and run: native executables (the disk
cache, checked in C++ by ``csrc/runtime/disk_cache.cpp``) and pickled traced
graphs (PyTorch's AOTAutograd cache, which torch.compile(backend="tpu") uses
as its trace cache). Like ssh with a key file, a cache is trusted only if no
other user can write it: the directory and its subdirectories must be owned
by this user (or root) and not group- or world-writable, and so must its
parents unless they are sticky (like ``/tmp``). This module applies the same
rule as the C++ check to the trace cache's directories.
"""
from __future__ import annotations

import os
import stat
import warnings

_verdicts: dict[str, bool] = {}


def _other_writers(path: str, st: os.stat_result, sticky_ok: bool) -> str | None:
    """Why another user could write ``path``, or None."""
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        return (f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid}): use a "
                "cache directory of your own")
    if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    if sticky_ok and st.st_mode & stat.S_ISVTX:
        return None
    who = "world" if st.st_mode & stat.S_IWOTH else "group"
    return f"{path} is {who}-writable (mode {st.st_mode & 0o7777:04o}): chmod go-w {path}"


def unsafe_reason(path: str, parents: bool = True) -> str | None:
    """Why the cache directory ``path`` must not be trusted, or None when it
    is safe or absent; with ``parents``, its parent directories are checked
    too."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    why = _other_writers(path, st, sticky_ok=False)
    if why or not parents:
        return why
    parent = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            why = _other_writers(parent, os.stat(parent), sticky_ok=True)
        except OSError:
            why = None
        if why:
            return "its parent " + why
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def trusted_cache_dir(path: str, what: str) -> bool:
    """Whether the cache directory ``path`` (and its subdirectories one level
    down) may be used; if not, warns once that ``what`` is off for this run."""
    if path not in _verdicts:
        why = unsafe_reason(path)
        for sub in _subdirs(path) if why is None else []:
            why = unsafe_reason(sub, parents=False)
            if why:
                break
        _verdicts[path] = why is None
        if why:
            warnings.warn(f"torch_tpu: {what} turned off for this run: {why}. It holds code "
                          "that is loaded and run, so no other user may be able to write it "
                          "(as ssh refuses a key file that others can write).", stacklevel=3)
    return _verdicts[path]


def trace_cache_is_safe() -> bool:
    """Whether torch.compile(backend="tpu") may use PyTorch's AOTAutograd
    cache: torch_tpu's disk cache is on (the native check accepted its
    directory) and the AOTAutograd cache directory is safe."""
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

    from . import _C

    if not _C._stats()["disk_cache_dir"]:
        return False
    root = AOTAutogradCache._get_tmp_dir()
    return trusted_cache_dir(os.path.dirname(root), "the torch.compile trace cache") and \
        trusted_cache_dir(root, "the torch.compile trace cache")
