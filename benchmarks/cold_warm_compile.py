"""Cold vs warm start of torch.compile(backend="tpu"): the first training step
and the first no-grad forward of the Llama-style model of llama_modes.py
(4 layers, hidden 256, seq 128, batch 4).

Each run is a child process with the SAME fresh caches, cold then warm:
torch_tpu's disk cache (executables) and PyTorch's cache directory, whose
AOTAutograd cache keeps what a compile traced (the forward/backward split,
decompositions, the module's builder calls). ``--no-trace-cache`` sets
``TORCHINDUCTOR_AUTOGRAD_CACHE=0``: the warm run then loads only the
executables, and re-traces with AOTAutograd, for comparison. Dynamo's own
bytecode tracing is redone by every process either way.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child():
    t0 = time.time()
    import torch
    import torch._dynamo  # noqa: F401  (imports: same work cold and warm)
    import torch._functorch.aot_autograd  # noqa: F401

    import torch_tpu
    import torch_tpu.compile as tc

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import llama_modes as L

    t_imports = time.time()
    m = L.model().to("tpu")
    x = L.example_input("tpu")
    cm = torch.compile(m, backend="tpu")
    t = time.time()
    loss = cm(x).pow(2).mean()
    loss.backward()
    loss = loss.item()
    t_train = time.time() - t
    t = time.time()
    with torch.no_grad():
        y = cm(x).sum().item()
    t_fwd = time.time() - t
    s, c = torch_tpu.debug.stats(), tc.stats()
    print("RESULT " + json.dumps({
        "imports": t_imports - t0, "train": t_train, "forward": t_fwd,
        "compiles": s["compiles"], "disk_hits": s["disk_hits"],
        "graphs": c["graphs"], "from_cache": c["graphs_from_cache"],
        "loss": loss, "y": y}), flush=True)


def run_child(env):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child"], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("the child failed:\n" + proc.stderr[-4000:])
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-trace-cache", action="store_true",
                   help="TORCHINDUCTOR_AUTOGRAD_CACHE=0: warm runs re-trace with AOTAutograd")
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        child()
        return
    with tempfile.TemporaryDirectory(prefix="cold_warm_compile_") as tmp:
        env = dict(os.environ, TORCH_TPU_CACHE_DIR=os.path.join(tmp, "tpu"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "torch"))
        if args.no_trace_cache:
            env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
        cold = run_child(env)
        warm = run_child(env)
    if (cold["loss"], cold["y"]) != (warm["loss"], warm["y"]):
        raise SystemExit(f"cold and warm runs differ: {cold} {warm}")
    print("torch.compile(backend='tpu'), Llama-style model of llama_modes.py; trace cache "
          + ("off (TORCHINDUCTOR_AUTOGRAD_CACHE=0)" if args.no_trace_cache else "on"))
    print(f"{'run':<6}{'first train step s':>20}{'first forward s':>17}{'compiles':>10}"
          f"{'disk_hits':>11}{'graphs':>8}{'from trace cache':>18}")
    for name, r in (("cold", cold), ("warm", warm)):
        print(f"{name:<6}{r['train']:>20.2f}{r['forward']:>17.2f}{r['compiles']:>10}"
              f"{r['disk_hits']:>11}{r['graphs']:>8}{r['from_cache']:>18}")
    print(f"warm/cold: first train step {warm['train'] / cold['train']:.0%}, "
          f"first forward {warm['forward'] / cold['forward']:.0%}")


if __name__ == "__main__":
    main()
