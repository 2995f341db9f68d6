"""A small Llama-style block stack in every execution mode, one run.

Forward and one training step (forward + backward + SGD) of a 4-layer,
hidden-256, seq-128, batch-4 decoder (RMSNorm, causal attention via SDPA,
SwiGLU MLP), timed in: PyTorch CPU eager (the baseline), torch_tpu strict
eager, fused eager, and torch.compile(backend="tpu"). Prints times and the
ratio to CPU eager. JAX is not a dependency of the project: when it is
installed, the same model jitted on XLA:CPU is timed too (the ceiling).
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu

LAYERS, HIDDEN, HEADS, SEQ, BATCH, FF = 4, 256, 4, 128, 4, 512


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


def timed(fn, sync, reps=7):
    """Median of `reps` synchronized runs, after one warm-up run (compiles)."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def run(device, mode):
    m = model().to(device)
    x = torch.randn(BATCH, SEQ, HIDDEN, device=device)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    fwd_model = torch.compile(m, backend="tpu") if mode == "compile" else m
    sync = {"tpu": torch.tpu.synchronize, "cuda": torch.cuda.synchronize}.get(
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
        with torch_tpu.fused():
            return timed(forward, sync), timed(step, sync)
    return timed(forward, sync), timed(step, sync)


def main():
    global LAYERS, HIDDEN, HEADS, SEQ, BATCH, FF
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default="cpu", choices=["cpu", "cuda"],
                   help="PyTorch eager device the ratios are against (cuda: on a GPU "
                        "machine running torch_tpu with TORCH_TPU_PLUGIN=cuda)")
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--hidden", type=int, default=HIDDEN)
    p.add_argument("--seq", type=int, default=SEQ)
    p.add_argument("--batch", type=int, default=BATCH)
    args = p.parse_args()
    LAYERS, HIDDEN, SEQ, BATCH = args.layers, args.hidden, args.seq, args.batch
    HEADS, FF = max(1, HIDDEN // 64), 2 * HIDDEN
    base_label = f"PyTorch {args.baseline.upper()} eager"
    rows = [(base_label, run(args.baseline, "eager"))]
    for mode, label in (("eager", "tpu strict eager"), ("fused", "tpu fused eager"),
                        ("compile", "tpu torch.compile")):
        try:
            rows.append((label, run("tpu", mode)))
        except Exception as e:  # a mode that fails is reported, not hidden
            rows.append((label + f" (failed: {type(e).__name__})", (float("nan"),) * 2))
    base_f, base_s = rows[0][1]
    print(f"{LAYERS} layers, hidden {HIDDEN}, seq {SEQ}, batch {BATCH} "
          f"({torch.tpu.get_platform()} plugin)")
    vs = "vs " + args.baseline.upper()
    print(f"{'mode':<34}{'forward ms':>12}{vs:>8}{'train step ms':>15}{vs:>8}")
    for label, (f, s) in rows:
        print(f"{label:<34}{f * 1e3:>12.1f}{f / base_f:>8.2f}{s * 1e3:>15.1f}{s / base_s:>8.2f}")


if __name__ == "__main__":
    main()
