"""The persistent compilation cache: warm start, corruption, off switch."""
import json
import os
import subprocess
import sys

PROGRAM = r"""
import json, torch, torch_tpu
x = torch.arange(12, dtype=torch.float32, device="tpu").reshape(3, 4)
y = ((x * 2 + 1).softmax(dim=-1) @ x.T).sum(dim=0)
s = torch_tpu.debug.stats()
print(json.dumps({"y": y.cpu().tolist(), "compiles": s["compiles"],
                  "disk_hits": s["disk_hits"], "disk_misses": s["disk_misses"]}))
"""


def run(cache_dir):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache_dir))
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
