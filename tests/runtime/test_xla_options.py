"""TORCH_TPU_XLA_OPTIONS: XLA debug options for every compile (the compile
options' env_option_overrides), part of the disk cache key, shown by
torch_tpu.debug.xla_compile_options(); an option XLA does not know fails
the compile with an error that names it and the variable."""
import json
import os
import subprocess
import sys

PROGRAM = r"""
import json, torch, torch_tpu
x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
y = ((x.to("tpu") * 2 + 1).softmax(dim=-1) @ x.to("tpu").T).sum(dim=0).cpu()
want = ((x * 2 + 1).softmax(dim=-1) @ x.T).sum(dim=0)
torch.testing.assert_close(y, want)
s = torch_tpu.debug.stats()
print(json.dumps({"options": torch_tpu.debug.xla_compile_options(),
                  "compiles": s["compiles"], "disk_hits": s["disk_hits"]}))
"""


def run(cache_dir="", options=None):
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache_dir))
    env.pop("TORCH_TPU_XLA_OPTIONS", None)
    if options is not None:
        env["TORCH_TPU_XLA_OPTIONS"] = options
    return subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          env=env, timeout=180)


def result(out):
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_options_are_in_force_and_shown():
    r = result(run(options="xla_cpu_use_fusion_emitters=false,,xla_backend_optimization_level=1"))
    assert r["options"] == {"xla_cpu_use_fusion_emitters": "false",
                            "xla_backend_optimization_level": "1"}
    assert r["compiles"] > 0
    assert result(run())["options"] == {}


def test_options_are_part_of_the_disk_cache_key(tmp_path):
    cold = result(run(tmp_path))
    assert cold["compiles"] > 0 and cold["disk_hits"] == 0
    other = result(run(tmp_path, "xla_backend_optimization_level=1"))
    assert other["compiles"] == cold["compiles"] and other["disk_hits"] == 0, other
    # The same options, in another order or spelled twice, share the entries.
    again = result(run(tmp_path, "xla_cpu_use_fusion_emitters=true,xla_backend_optimization_level=0,"
                                 "xla_backend_optimization_level=1"))
    assert again["compiles"] == cold["compiles"], again
    same = result(run(tmp_path, "xla_backend_optimization_level=1,xla_cpu_use_fusion_emitters=true"))
    assert same["compiles"] == 0 and same["disk_hits"] == cold["compiles"], same
    assert result(run(tmp_path))["compiles"] == 0


def test_unknown_option_names_the_option_and_the_variable():
    out = run(options="xla_cpu_no_such_option=1")
    assert out.returncode != 0
    assert "RuntimeError" in out.stderr, out.stderr
    assert "TORCH_TPU_XLA_OPTIONS sets 'xla_cpu_no_such_option'" in out.stderr, out.stderr
    assert "Segmentation" not in out.stderr


def test_malformed_list_is_a_clear_error():
    out = run(options="xla_cpu_use_fusion_emitters")
    assert out.returncode != 0
    assert "TORCH_TPU_XLA_OPTIONS: expected name=value, got 'xla_cpu_use_fusion_emitters'" in out.stderr, \
        out.stderr
