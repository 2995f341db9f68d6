"""A small Llama-style block stack in every execution mode, one run.

Forward and one training step (forward + backward + SGD) of a 4-layer,
hidden-256, seq-128, batch-4 decoder (RMSNorm, causal attention via SDPA,
SwiGLU MLP), timed in: PyTorch CPU eager (the baseline), torch.compile with
the default Inductor backend on CPU tensors, torch_tpu strict eager, fused
eager and torch.compile(backend="tpu"), and the SAME model written in JAX and
jax.jit-ed on XLA:CPU (the ceiling of the XLA path; its weights are copied
from the torch model and its forward is checked against torch's). Prints
times and the ratios to CPU eager and to jax.jit.

JAX is not a dependency of the project: without it the JAX row is skipped
(``pip install jax==0.10.2 jaxlib==0.10.2``, which leaves torch alone).

``--baseline cuda`` times PyTorch CUDA eager in a child process that does not
load torch_tpu (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``): with two accelerators in
one process PyTorch's autograd engine tracks only one of them and CUDA
backward asserts ("opt_ready_stream && opt_parent_stream").
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS, HIDDEN, HEADS, SEQ, BATCH, FF = 4, 256, 4, 128, 4, 512
REPS = 7
JAX_PIN = "pip install jax==0.10.2 jaxlib==0.10.2"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.up = nn.Linear(HIDDEN, 2 * FF, bias=False)
        self.down = nn.Linear(FF, HIDDEN, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, HEADS, -1).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, HIDDEN))
        gate, up = self.up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def model():
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(LAYERS)])


def example_input(device="cpu"):
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, SEQ, HIDDEN, generator=g).to(device)


STAT = "median"


def summarize(times):
    times = sorted(times)
    return times[0] if STAT == "min" else times[len(times) // 2]


def timed(fn, sync, reps=None):
    """`STAT` of `reps` synchronized runs, after one warm-up run (compiles)."""
    fn()
    sync()
    times = []
    for _ in range(reps or REPS):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return summarize(times)


def interleaved(modes, reps):
    """Times every mode's forward and step in rounds (one run of each per
    round), so that a load change on a shared machine hits all modes alike.
    `modes`: label -> (forward, step, sync), already warmed up.
    Returns label -> (forward seconds, step seconds)."""
    times = {label: ([], []) for label in modes}
    for _ in range(reps):
        for label, fns in modes.items():
            sync = fns[2]
            for k in (0, 1):
                start = time.perf_counter()
                fns[k]()
                sync()
                times[label][k].append(time.perf_counter() - start)
    return {label: (summarize(f), summarize(s)) for label, (f, s) in times.items()}


def setup(device, mode):
    """(forward, step, sync) of the torch model on `device` in `mode`, warmed up
    (compiled)."""
    if device == "tpu":
        import torch_tpu  # noqa: F401  (autoloaded with torch; explicit when autoload is off)
    m = model().to(device)
    x = example_input(device)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    if mode == "compile":
        fwd_model = torch.compile(m, backend="tpu")
    elif mode == "inductor":
        fwd_model = torch.compile(m)  # the default backend: Inductor (C++ on CPU)
    else:
        fwd_model = m
    sync = {"tpu": lambda: torch.tpu.synchronize(), "cuda": torch.cuda.synchronize}.get(
        device, lambda: None)

    def forward():
        with torch.no_grad():
            return fwd_model(x).sum().item()

    def step():
        opt.zero_grad()
        loss = fwd_model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.item()

    if mode == "fused":
        import torch_tpu

        def in_fused(fn):
            def run_fused():
                with torch_tpu.fused():
                    return fn()
            return run_fused

        forward, step = in_fused(forward), in_fused(step)
    for fn in (forward, step):
        fn()
        sync()
    return forward, step, sync


def run(device, mode):
    """(forward seconds, train step seconds) of the torch model on `device` in `mode`."""
    forward, step, sync = setup(device, mode)
    return timed(forward, sync), timed(step, sync)


# ------------------------------------------------------------------ JAX


def jax_params(m):
    """The torch model's weights as numpy arrays, in the layout the JAX model uses."""
    layers = []
    for blk in m:
        layers.append({
            "n1": blk.n1.weight.detach().numpy().copy(),
            "n2": blk.n2.weight.detach().numpy().copy(),
            # nn.Linear computes x @ W.T: keep W.T so the JAX model does x @ W.
            "qkv": blk.qkv.weight.detach().numpy().T.copy(),
            "o": blk.o.weight.detach().numpy().T.copy(),
            "up": blk.up.weight.detach().numpy().T.copy(),
            "down": blk.down.weight.detach().numpy().T.copy(),
        })
    return layers


def jax_model():
    """forward(params, x) of the same decoder, written with jax.numpy."""
    import jax
    import jax.numpy as jnp

    eps = float(torch.finfo(torch.float32).eps)  # nn.RMSNorm's default eps

    def rms_norm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def block(p, x):
        b, s, _ = x.shape
        d = HIDDEN // HEADS
        qkv = (rms_norm(x, p["n1"]) @ p["qkv"]).reshape(b, s, 3, HEADS, d)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # b h s d
        scores = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(jnp.float32(d))
        causal = jnp.tril(jnp.ones((s, s), dtype=bool))
        scores = jnp.where(causal, scores, -jnp.inf)
        a = jax.nn.softmax(scores, axis=-1) @ v
        x = x + a.transpose(0, 2, 1, 3).reshape(b, s, HIDDEN) @ p["o"]
        gate, up = jnp.split(rms_norm(x, p["n2"]) @ p["up"], 2, axis=-1)
        return x + (jax.nn.silu(gate) * up) @ p["down"]

    def forward(params, x):
        for p in params:
            x = block(p, x)
        return x

    return forward


def run_jax():
    """((forward, step, sync) warmed up, max |jax - torch| of the forward)."""
    import jax
    import jax.numpy as jnp

    m = model()
    x_t = example_input()
    with torch.no_grad():
        ref = m(x_t).numpy()
    forward = jax_model()
    params = jax.device_put(jax_params(m))
    x = jax.device_put(x_t.numpy())
    out = jax.jit(forward)(params, x)
    err = float(jnp.max(jnp.abs(out - ref)))
    scale = float(abs(ref).max())
    if not err <= 1e-4 * max(1.0, scale):
        raise AssertionError(f"JAX forward differs from torch's by {err} (max |out| {scale})")

    fwd = jax.jit(lambda p, x: forward(p, x).sum())

    def loss_fn(p, x):
        return jnp.mean(forward(p, x) ** 2)

    @jax.jit
    def step(p, x):
        loss, g = jax.value_and_grad(loss_fn)(p, x)
        return jax.tree_util.tree_map(lambda w, gw: w - 1e-3 * gw, p, g), loss

    state = {"p": params}

    def train():
        state["p"], loss = step(state["p"], x)
        return float(loss)

    def forward_sum():
        return float(fwd(params, x))

    for fn in (forward_sum, train):
        fn()
    return (forward_sum, train, lambda: None), err


def run_jax_on_plugin():
    """(forward, step, sync) of JAX's own modules (the
    jax.jit-lowered StableHLO of the forward and of the train step) run on
    torch_tpu's PJRT plugin: jax.jit on the same compiler as ours, which
    separates the quality of our graphs from the XLA version of the plugin."""
    import jax
    import jax.numpy as jnp
    import torch_tpu

    m = model()
    x_t = example_input()
    forward = jax_model()
    flat, tree = jax.tree_util.tree_flatten(jax_params(m))
    shapes = [a.shape for a in flat]
    nparams = len(flat)

    # Module parameters and results are 1-D, as torch_tpu's storages are.
    def unflatten(args):
        return jax.tree_util.tree_unflatten(tree, [a.reshape(s) for a, s in zip(args, shapes)])

    def fwd_flat(*args):
        return forward(unflatten(args[:-1]), args[-1].reshape(x_t.shape)).reshape(-1)

    def step_flat(*args):
        def loss_fn(p):
            return jnp.mean(forward(p, args[-1].reshape(x_t.shape)) ** 2)

        p = unflatten(args[:-1])
        loss, g = jax.value_and_grad(loss_fn)(p)
        new = jax.tree_util.tree_map(lambda w, gw: w - 1e-3 * gw, p, g)
        return tuple(w.reshape(-1) for w in jax.tree_util.tree_leaves(new)) + (loss.reshape(1),)

    specs = [jax.ShapeDtypeStruct((a.size,), jnp.float32) for a in flat]
    specs.append(jax.ShapeDtypeStruct((x_t.numel(),), jnp.float32))
    in_specs = [(torch.float32, [a.size]) for a in flat] + [(torch.float32, list(x_t.shape))]
    Graph = torch_tpu._C._Graph
    # The matmul precision torch uses ("highest" by default: full f32, no
    # TF32 on a GPU), so that both sides do the same arithmetic.
    precision = {"highest": "highest", "high": "tensorfloat32"}.get(
        torch.get_float32_matmul_precision(), "bfloat16")
    with jax.default_matmul_precision(precision):
        fwd_text = jax.jit(fwd_flat).lower(*specs).as_text()
        step_text = jax.jit(step_flat).lower(*specs).as_text()
    fwd_g = Graph.from_text(fwd_text, in_specs, [(torch.float32, list(x_t.shape))])
    step_g = Graph.from_text(step_text, in_specs,
                             [(torch.float32, [a.size]) for a in flat] + [(torch.float32, [1])])
    fwd_g.compile(0)
    step_g.compile(0)
    ins = [torch.from_numpy(a.reshape(-1).copy()).to("tpu") for a in flat] + [x_t.to("tpu")]
    with torch.no_grad():
        ref = m(x_t)
    tol = 1e-4 if precision == "highest" else 2e-2
    torch.testing.assert_close(fwd_g.run(ins)[0].cpu(), ref, rtol=tol, atol=tol)
    state = {"ins": list(ins)}

    def train():
        outs = step_g.run(state["ins"])
        state["ins"][:nparams] = outs[:nparams]
        return outs[nparams].item()

    def forward_sum():
        return fwd_g.run(ins)[0].sum().item()

    sync = torch.tpu.synchronize
    for fn in (forward_sum, train):
        fn()
        sync()
    return forward_sum, train, sync




# ------------------------------------------------------------------ CUDA child


def cuda_baseline(args):
    """PyTorch CUDA eager timed in a child process without torch_tpu."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    cmd = [sys.executable, os.path.abspath(__file__), "--_cuda-child", "--layers", str(args.layers),
           "--hidden", str(args.hidden), "--seq", str(args.seq), "--batch", str(args.batch),
           "--reps", str(args.reps), "--stat", args.stat]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("the PyTorch CUDA baseline failed:\n" + proc.stderr[-4000:])
    for line in proc.stdout.splitlines():
        if line.startswith("CUDA_TIMES "):
            return tuple(json.loads(line[len("CUDA_TIMES "):]))
    raise RuntimeError("the PyTorch CUDA baseline printed no times:\n" + proc.stdout[-2000:])


def main():
    global LAYERS, HIDDEN, HEADS, SEQ, BATCH, FF, REPS, STAT
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="cpu", choices=["cpu", "cuda"],
                   help="PyTorch eager device the ratios are against (cuda: on a GPU "
                        "machine running torch_tpu with TORCH_TPU_PLUGIN=cuda; measured in "
                        "a child process without torch_tpu)")
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--hidden", type=int, default=HIDDEN)
    p.add_argument("--seq", type=int, default=SEQ)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--reps", type=int, default=REPS, help="timed rounds (runs per mode)")
    p.add_argument("--stat", default=STAT, choices=["median", "min"],
                   help="statistic over the rounds (min: least disturbed by other load)")
    p.add_argument("--no-inductor", action="store_true", help="skip the Inductor CPU row")
    p.add_argument("--no-jax", action="store_true", help="skip the jax.jit row")
    p.add_argument("--_cuda-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    LAYERS, HIDDEN, SEQ, BATCH, REPS = args.layers, args.hidden, args.seq, args.batch, args.reps
    STAT = args.stat
    HEADS, FF = max(1, HIDDEN // 64), 2 * HIDDEN
    if args._cuda_child:
        print("CUDA_TIMES " + json.dumps(run("cuda", "eager")), flush=True)
        return

    import torch_tpu  # noqa: F401

    nan = (float("nan"),) * 2
    modes, failed, notes = {}, {}, []
    cuda = cuda_baseline(args) if args.baseline == "cuda" else None

    def add(label, make):
        try:
            modes[label] = make()
        except Exception as e:  # a mode that fails is reported, not hidden
            failed[f"{label} (failed: {type(e).__name__})"[:60]] = nan
            notes.append(f"{label} failed: {type(e).__name__}: {str(e)[:300]}")

    # With a CUDA baseline the CPU-only rows (PyTorch CPU eager, Inductor on
    # CPU, jax.jit on jaxlib's XLA:CPU) are left out: at GPU sizes they would
    # take most of the time; JAX's modules still run on the tpu plugin.
    cpu_rows = args.baseline == "cpu"
    if cpu_rows:
        add("PyTorch CPU eager", lambda: setup("cpu", "eager"))
    else:
        notes.append("CPU rows (PyTorch eager, Inductor, jax.jit on XLA:CPU) skipped with "
                     "--baseline cuda")
    if cpu_rows and not args.no_inductor:
        add("PyTorch CPU torch.compile (Inductor)", lambda: setup("cpu", "inductor"))
    jax_label = jaxp_label = None
    if args.no_jax:
        notes.append("jax.jit rows skipped (--no-jax)")
    else:
        try:
            import jax
        except ImportError:
            jax = None
            notes.append(f"jax.jit rows skipped: JAX is not installed ({JAX_PIN})")
        if jax is not None:
            jax_label = f"JAX {jax.__version__} jax.jit (jaxlib XLA:CPU)"
            jaxp_label = "JAX's modules on the tpu plugin"

            def make_jax():
                fns, err = run_jax()
                notes.append(f"JAX forward equals torch's: max abs diff {err:.2e}")
                return fns

            if cpu_rows:
                add(jax_label, make_jax)
            add(jaxp_label, run_jax_on_plugin)
    for mode, label in (("eager", "tpu strict eager"), ("fused", "tpu fused eager"),
                        ("compile", "tpu torch.compile")):
        add(label, lambda mode=mode: setup("tpu", mode))
    measured = interleaved(modes, REPS)
    rows = ([("PyTorch CUDA eager (child process)", cuda)] if cuda else [])
    rows += list(measured.items()) + list(failed.items())
    jax_times = measured.get(jax_label)
    plugin_times = measured.get(jaxp_label)

    base_label = f"PyTorch {args.baseline.upper()} eager"
    base_f, base_s = next(t for label, t in rows if label.startswith(base_label))
    jax_f, jax_s = jax_times or nan
    jp_f, jp_s = plugin_times or nan
    print(f"{LAYERS} layers, hidden {HIDDEN}, seq {SEQ}, batch {BATCH} "
          f"({torch.tpu.get_platform()} plugin; {STAT} of {REPS} interleaved rounds)")
    vs = "vs " + args.baseline.upper()
    cols = f"{vs:>8}{'vs JAX':>8}{'vs JAXp':>8}"
    print(f"{'mode':<38}{'fwd ms':>8}{cols}{'step ms':>9}{cols}")
    for label, (f, s) in rows:
        print(f"{label:<38}{f * 1e3:>8.1f}{f / base_f:>8.2f}{f / jax_f:>8.2f}{f / jp_f:>8.2f}"
              f"{s * 1e3:>9.1f}{s / base_s:>8.2f}{s / jax_s:>8.2f}{s / jp_s:>8.2f}")
    print("vs JAX: ratio to jax.jit on jaxlib's XLA:CPU; vs JAXp: ratio to JAX's modules run "
          "on the tpu plugin (same compiler as the tpu rows)")
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
