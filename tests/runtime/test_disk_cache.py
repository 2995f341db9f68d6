"""The persistent compilation cache: warm start, corruption, off switch."""
import json
import os
import subprocess
import sys

PROGRAM = r"""
import json, os, time, torch, torch_tpu
want = int(os.environ.get("WAIT_PREFETCHED", "0"))
deadline = time.time() + 60
while torch_tpu.debug.stats()["disk_prefetched"] < want and time.time() < deadline:
    time.sleep(0.05)
x = torch.arange(12, dtype=torch.float32, device="tpu").reshape(3, 4)
y = ((x * 2 + 1).softmax(dim=-1) @ x.T).sum(dim=0)
s = torch_tpu.debug.stats()
print(json.dumps({"y": y.cpu().tolist(), "compiles": s["compiles"],
                  "disk_hits": s["disk_hits"], "disk_misses": s["disk_misses"],
                  "disk_prefetched": s["disk_prefetched"]}))
"""


def run(cache_dir, **extra_env):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache_dir), **extra_env)
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_second_process_starts_warm(tmp_path):
    cold, _ = run(tmp_path)
    assert cold["compiles"] > 0 and cold["disk_hits"] == 0
    assert cold["disk_misses"] == cold["compiles"]
    assert any(p.suffix == ".xc" for p in tmp_path.iterdir())
    warm, _ = run(tmp_path)
    assert warm["compiles"] == 0, warm
    assert warm["disk_hits"] == cold["compiles"]
    assert warm["y"] == cold["y"]


def test_corrupted_entries_are_reported_once_and_recompiled(tmp_path):
    cold, _ = run(tmp_path)
    entries = sorted(p for p in tmp_path.iterdir() if p.suffix == ".xc")
    # Truncate one, flip bytes in another.
    entries[0].write_bytes(entries[0].read_bytes()[:20])
    data = bytearray(entries[1].read_bytes())
    data[-10] ^= 0xFF
    entries[1].write_bytes(bytes(data))
    again, stderr = run(tmp_path)
    assert again["y"] == cold["y"]
    assert again["compiles"] == 2 and again["disk_hits"] == cold["compiles"] - 2
    assert stderr.count("damaged compilation cache entry") == 1
    # Repaired: the next process is fully warm.
    warm, _ = run(tmp_path)
    assert warm["compiles"] == 0


def test_leftover_temporary_files_are_ignored(tmp_path):
    (tmp_path / "0123.xc.tmp.99.abc").write_bytes(b"partial write of a killed process")
    cold, _ = run(tmp_path)
    assert cold["compiles"] > 0


def test_empty_dir_turns_it_off(tmp_path):
    a, _ = run("")
    b, _ = run("")
    assert a["disk_hits"] == 0 and b["disk_hits"] == 0 and b["compiles"] > 0


def test_prefetch_loads_the_programs_executables_in_the_background(tmp_path):
    cold, _ = run(tmp_path)
    manifests = list((tmp_path / "prefetch").iterdir())
    assert len(manifests) == 1 and manifests[0].suffix == ".list"
    # The next run of the same program finds every executable of the first
    # run already loaded by the background thread (the program waits for it
    # before its first op, so the test does not depend on timing).
    warm, _ = run(tmp_path, WAIT_PREFETCHED=str(cold["compiles"]))
    assert warm["disk_prefetched"] == cold["compiles"], warm
    assert warm["disk_hits"] == cold["compiles"] and warm["compiles"] == 0
    assert warm["y"] == cold["y"]
    # The manifest did not grow: nothing new was used.
    assert list((tmp_path / "prefetch").iterdir()) == manifests


def test_prefetch_skips_damaged_entries_and_can_be_turned_off(tmp_path):
    cold, _ = run(tmp_path)
    entry = sorted(p for p in tmp_path.iterdir() if p.suffix == ".xc")[0]
    entry.write_bytes(entry.read_bytes()[:30])
    again, stderr = run(tmp_path, WAIT_PREFETCHED=str(cold["compiles"] - 1))
    assert again["y"] == cold["y"]
    assert again["disk_prefetched"] == cold["compiles"] - 1 and again["compiles"] == 1
    assert stderr.count("damaged compilation cache entry") == 1
    off, _ = run(tmp_path, TORCH_TPU_CACHE_PREFETCH="0")
    assert off["disk_prefetched"] == 0 and off["compiles"] == 0
    assert off["disk_hits"] == cold["compiles"] and off["y"] == cold["y"]
