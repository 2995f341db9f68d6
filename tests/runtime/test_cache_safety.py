"""Caches that another user could write are refused (they hold code that is
loaded and run): the run goes on without them, with one warning."""
import os
import warnings

from test_disk_cache import run

WARNING = "disk compilation cache turned off for this run"


def entries(path):
    return [p for p in path.iterdir() if p.suffix == ".xc"]


def test_world_writable_cache_dir_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    first, stderr = run(cache)
    assert stderr.count(WARNING) == 1, stderr
    assert f"{cache} is world-writable (mode 0777): chmod go-w {cache}" in stderr
    assert first["compiles"] > 0 and first["disk_hits"] == 0 and first["disk_misses"] == 0
    assert not any(cache.iterdir())  # nothing written, nothing read
    cache.chmod(0o700)  # fixed: the cache works again
    cold, stderr = run(cache)
    assert WARNING not in stderr and cold["y"] == first["y"]
    assert entries(cache) and cold["disk_misses"] == cold["compiles"]


def test_what_the_cache_writes_is_private_and_accepted(tmp_path):
    old = os.umask(0o002)  # a umask that would make new files group-writable
    try:
        cold, _ = run(tmp_path / "cache")
    finally:
        os.umask(old)
    cache = tmp_path / "cache"
    modes = {p.name: p.stat().st_mode & 0o777 for p in [cache, cache / "prefetch",
                                                         *entries(cache),
                                                         *(cache / "prefetch").iterdir()]}
    assert set(modes.values()) <= {0o700, 0o600}, modes
    warm, stderr = run(cache)
    assert WARNING not in stderr and warm["compiles"] == 0


def test_an_entry_writable_by_others_turns_the_cache_off(tmp_path):
    cold, _ = run(tmp_path, TORCH_TPU_CACHE_PREFETCH="0")
    entries(tmp_path)[0].chmod(0o666)
    again, stderr = run(tmp_path, TORCH_TPU_CACHE_PREFETCH="0")
    assert stderr.count(WARNING) == 1, stderr
    assert "is world-writable (mode 0666)" in stderr
    assert again["y"] == cold["y"] and again["compiles"] > 0


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
