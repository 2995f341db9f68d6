"""torch.compile(backend="tpu") across processes: PyTorch's AOTAutograd cache
keeps what a compile traced (forward, backward, inference graphs), torch_tpu's
disk cache the executables, so a second process compiles nothing and traces
only with Dynamo. Checked against the first process's numbers (which
test_compile.py checks against eager)."""
import json
import os
import subprocess
import sys

PROGRAM = r"""
import json, torch, torch_tpu, torch_tpu.compile as tc
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("tpu")
x = torch.randn(5, 8).to("tpu")
cm = torch.compile(m, backend="tpu")
loss = cm(x).pow(2).mean()
loss.backward()
with torch.no_grad():
    y = cm(x * 2)
s, c = torch_tpu.debug.stats(), tc.stats()
print(json.dumps({"loss": loss.item(), "grads": [p.grad.cpu().tolist() for p in m.parameters()],
                  "y": y.cpu().tolist(), "compiles": s["compiles"], "graphs": c["graphs"],
                  "native": c["native_graphs"], "from_cache": c["graphs_from_cache"]}))
"""


def run(tmp_path, **env_extra):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path / "tpu"),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "torch"))
    env.pop("TORCHINDUCTOR_AUTOGRAD_CACHE", None)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def entries(tmp_path):
    root = tmp_path / "torch" / "aotautograd"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def same_numbers(a, b):
    assert a["loss"] == b["loss"] and a["grads"] == b["grads"] and a["y"] == b["y"]


def test_second_process_loads_traced_graphs(tmp_path):
    cold, _ = run(tmp_path)
    # forward + backward of the training graph, and the inference graph
    assert cold["graphs"] == cold["native"] == 3 and cold["from_cache"] == 0
    assert cold["compiles"] > 0
    assert len(entries(tmp_path)) == 2  # one entry per Dynamo graph
    warm, stderr = run(tmp_path)
    assert warm["from_cache"] == 3 and warm["native"] == 3, warm
    assert warm["compiles"] == 0, warm
    same_numbers(warm, cold)
    assert "Warning" not in stderr and "warning" not in stderr, stderr[-2000:]


def test_damaged_entries_are_recompiled(tmp_path):
    cold, _ = run(tmp_path)
    files = entries(tmp_path)
    files[0].write_bytes(files[0].read_bytes()[:40])  # truncated
    data = bytearray(files[1].read_bytes())
    data[len(data) // 2:] = bytes(len(data) - len(data) // 2)  # zeroed tail
    files[1].write_bytes(bytes(data))
    again, _ = run(tmp_path)
    same_numbers(again, cold)
    assert again["graphs"] == again["native"] == 3
    assert again["from_cache"] == 0, again
    warm, _ = run(tmp_path)  # rewritten by that process
    assert warm["from_cache"] == 3 and warm["compiles"] == 0, warm
    same_numbers(warm, cold)


def test_off_with_the_disk_cache(tmp_path):
    off, _ = run(tmp_path, TORCH_TPU_CACHE_DIR="")
    assert entries(tmp_path) == []
    assert off["from_cache"] == 0


def test_key_covers_torch_tpu_settings(tmp_path):
    """Entries traced under other torch_tpu settings (here the partitioner;
    likewise another torch_tpu build or lowering code) are not used."""
    cold, _ = run(tmp_path)
    other, _ = run(tmp_path, TORCH_TPU_COMPILE_PARTITION="default")
    assert other["from_cache"] == 0 and other["graphs"] == 3, other
    assert other["loss"] == cold["loss"] and other["y"] == cold["y"]
