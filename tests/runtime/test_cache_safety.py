"""Caches that another user could write are refused (they hold code that is
loaded and run): the run goes on without them, with one warning."""
import os
import warnings

import pytest

from test_disk_cache import run

WARNING = "disk compilation cache turned off for this run"


def expected_y():
    import torch

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return ((x * 2 + 1).softmax(dim=-1) @ x.T).sum(dim=0).tolist()


EXPECTED_Y = expected_y()


def entries(path):
    return [p for p in path.iterdir() if p.suffix == ".xc"]


def test_world_writable_cache_dir_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    result, stderr = run(cache)
    assert stderr.count(WARNING) == 1, stderr
    assert f"{cache} is world-writable (mode 0777): chmod go-w {cache}" in stderr
    assert result["compiles"] > 0 and result["disk_hits"] == 0 and result["disk_misses"] == 0
    assert not any(cache.iterdir())  # nothing written, nothing read
    assert result["y"] == pytest.approx(EXPECTED_Y, rel=1e-5)


def test_cache_files_are_private_and_an_entry_writable_by_others_is_refused(tmp_path):
    cache = tmp_path / "cache"
    old = os.umask(0o002)  # a umask that would make new files group-writable
    try:
        cold, stderr = run(cache)
    finally:
        os.umask(old)
    assert WARNING not in stderr and cold["compiles"] > 0
    files = [cache, cache / "prefetch", *entries(cache), *(cache / "prefetch").iterdir()]
    modes = {p.name: p.stat().st_mode & 0o777 for p in files}
    assert len(modes) > 3 and set(modes.values()) <= {0o700, 0o600}, modes
    entries(cache)[0].chmod(0o666)
    again, stderr = run(cache, TORCH_TPU_CACHE_PREFETCH="0")
    assert stderr.count(WARNING) == 1, stderr
    assert "is world-writable (mode 0666)" in stderr
    assert again["y"] == cold["y"] == pytest.approx(EXPECTED_Y, rel=1e-5)
    assert again["compiles"] > 0


def test_trace_cache_dir_writable_by_others_is_refused(tmp_path, monkeypatch):
    from torch_tpu import cache_safety, compile as tpu_compile

    inductor = tmp_path / "inductor"
    (inductor / "aotautograd").mkdir(parents=True)
    inductor.chmod(0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    monkeypatch.setattr(cache_safety, "_verdicts", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not tpu_compile._cache_traces()
        assert not tpu_compile._cache_traces()
    texts = [str(w.message) for w in caught if "trace cache" in str(w.message)]
    assert len(texts) == 1 and "world-writable" in texts[0], texts
    inductor.chmod(0o755)
    (inductor / "aotautograd").chmod(0o775)  # a group-writable subdirectory
    monkeypatch.setattr(cache_safety, "_verdicts", {})
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert not cache_safety.trace_cache_is_safe()
    (inductor / "aotautograd").chmod(0o755)
    monkeypatch.setattr(cache_safety, "_verdicts", {})
    assert cache_safety.trace_cache_is_safe() == bool(
        __import__("torch_tpu").debug.stats()["disk_cache_dir"])


def test_parents_are_checked_unless_sticky(tmp_path):
    from torch_tpu.cache_safety import unsafe_reason

    parent = tmp_path / "shared"
    (parent / "cache").mkdir(parents=True)
    parent.chmod(0o777)
    assert "its parent" in unsafe_reason(str(parent / "cache"))
    parent.chmod(0o1777)
    assert unsafe_reason(str(parent / "cache")) is None
    assert unsafe_reason(str(tmp_path / "absent")) is None
