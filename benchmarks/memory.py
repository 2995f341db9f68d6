"""Peak device memory of a training step against the live bytes it needs.

The benchmarks/llama_modes.py model (4 layers, hidden 256, seq 128, batch 4
by default) with AdamW, in strict eager, fused eager and
torch.compile(backend="tpu"). After a warm-up step (compiles, optimizer
state exists), each phase runs with the peak counter reset:

- forward (loss, with autograd): needs parameters P, optimizer state S,
  input X and the activations it saves for backward A (measured: what
  the forward leaves allocated);
- backward: needs P + S + X + A + gradients G (A is freed as G grows, so
  this bounds what must coexist);
- AdamW step: needs P + S + X + G (updates in place, donated buffers).

Prints, per mode and phase, the peak of ``torch.tpu.max_memory_allocated()``
(bytes of the device buffers live storages hold, including buffers a fused
chain still reads) against those live bytes, and flags ratios above 1.1x.
After each phase it also checks the counter against the plugin: the PJRT
buffers the process holds (alive, not deleted by a donation; their
``PJRT_Buffer_OnDeviceSizeInBytes``) must add up to ``memory_allocated()``
(a donated buffer left behind, or a second buffer per storage, would show
here as "plugin" bytes above it).

In compile mode the AdamW step is compiled too (``torch.compile`` around
``opt.step``, PyTorch's recipe for compiled optimizers; ``--eager-step``
runs it eagerly). Strict eager runs PyTorch's default foreach AdamW as is:
its ``_foreach_sqrt(exp_avg_sqs)`` materializes one parameter-sized
temporary (1.25x, as on CUDA); ``--optimizer-impl fused`` avoids it.
``--optimizer-impl`` chooses AdamW's implementation (default: PyTorch's
choice for the device). Not a test: ``python benchmarks/memory.py``.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_modes  # noqa: E402

MODES = ("strict", "fused", "compile")
MiB = 1 << 20


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_state_bytes(opt):
    return nbytes(v for s in opt.state.values() for v in s.values()
                  if torch.is_tensor(v) and v.device.type == "tpu")


def build(mode, impl, eager_step=False):
    import torch_tpu  # noqa: F401

    model = llama_modes.model().to("tpu")
    x = llama_modes.example_input("tpu")
    kwargs = {} if impl == "default" else {impl: True}
    if mode == "compile" and not eager_step:
        kwargs["capturable"] = True  # step counts on the device: one graph, no host scalars
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **kwargs)
    fwd = torch.compile(model, backend="tpu") if mode == "compile" else model
    opt_step = opt.step
    if mode == "compile" and not eager_step:
        opt_step = torch.compile(opt.step, backend="tpu")
    return model, x, opt, fwd, opt_step


def plugin_bytes():
    """Bytes of the PJRT buffers the process holds on tpu:0, as the plugin reports them."""
    import torch_tpu

    return torch_tpu._C._plugin_memory(0)["live_buffer_bytes"]


def measured(fn, mode):
    """(result, peak bytes, bytes allocated after) of fn() on tpu:0."""
    import torch_tpu

    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    if mode == "fused":
        with torch_tpu.fused():
            out = fn()
    else:
        out = fn()
    torch.tpu.synchronize()
    after = torch.tpu.memory_allocated()
    extra = plugin_bytes() - after  # what the counter does not see
    return out, torch.tpu.max_memory_allocated(), after, extra


def run_mode(mode, impl, eager_step=False):
    model, x, opt, fwd, opt_step = build(mode, impl, eager_step)

    def forward():
        return fwd(x).pow(2).mean()

    def step():
        opt_step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: compiles, creates the optimizer state
        loss = forward()
        loss.backward()
        step()
    del loss
    torch.tpu.synchronize()
    P = nbytes(model.parameters())
    S = optimizer_state_bytes(opt)
    X = nbytes([x])
    base = torch.tpu.memory_allocated()
    loss, fwd_peak, after_fwd, fwd_extra = measured(forward, mode)
    A = after_fwd - base
    _, bwd_peak, after_bwd, bwd_extra = measured(lambda: loss.backward(), mode)
    del loss
    torch.tpu.synchronize()
    G = nbytes(p.grad for p in model.parameters() if p.grad is not None)
    _, step_peak, _, step_extra = measured(step, mode)
    rows = [("forward", fwd_peak, P + S + X + A, fwd_extra),
            ("backward", bwd_peak, P + S + X + A + G, bwd_extra),
            ("adamw step", step_peak, P + S + X + G, step_extra)]
    temps = algorithm_temporaries(opt, model, mode)
    if temps:
        rows.append(("  + temps", step_peak, P + S + X + G + temps, step_extra))
    return {"P": P, "S": S, "X": X, "A": A, "G": G, "base": base, "rows": rows,
            "unaccounted": base - (P + S + X)}


def algorithm_temporaries(opt, model, mode):
    """Bytes AdamW's own algorithm holds at once on top of P, G and S when each op
    runs by itself (strict eager): the foreach path's denominator list
    (``_foreach_sqrt(exp_avg_sqs)``, one tensor per parameter, all alive together),
    the single-tensor path's one denominator of the largest parameter; none for
    the fused kernel, and none where a fused chain or a compiled step never
    materializes them."""
    if mode != "strict" or opt.defaults.get("fused"):
        return 0
    params = [p for p in model.parameters() if p.requires_grad]
    if opt.defaults.get("foreach") is False:
        return max(p.numel() * p.element_size() for p in params)
    return nbytes(params)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--optimizer-impl", default="default", choices=["default", "foreach", "fused"])
    p.add_argument("--eager-step", action="store_true", help="compile mode: run opt.step eagerly")
    p.add_argument("--layers", type=int, default=llama_modes.LAYERS)
    p.add_argument("--hidden", type=int, default=llama_modes.HIDDEN)
    args = p.parse_args()
    llama_modes.LAYERS, llama_modes.HIDDEN = args.layers, args.hidden
    print(f"AdamW ({args.optimizer_impl}), {args.layers} layers, hidden {args.hidden}; "
          "MiB; ratio = peak / live bytes needed; plugin+ = bytes of PJRT buffers beyond "
          "memory_allocated() after the phase")
    print(f"{'mode':<9}{'phase':<12}{'peak':>9}{'needed':>9}{'ratio':>8}{'plugin+':>9}   live bytes")
    above = []
    for mode in args.modes.split(","):
        r = run_mode(mode, args.optimizer_impl, args.eager_step)
        parts = " ".join(f"{k}={r[k] / MiB:.2f}" for k in ("P", "S", "G", "A", "X"))
        for phase, peak, needed, extra in r["rows"]:
            ratio = peak / needed
            flag = "  <-- above 1.1x" if ratio > 1.1 else ""
            print(f"{mode:<9}{phase:<12}{peak / MiB:>9.2f}{needed / MiB:>9.2f}{ratio:>8.3f}{extra:>9}   "
                  f"{parts}{flag}")
            if ratio > 1.1:
                above.append((mode, phase, ratio))
        if r["unaccounted"]:
            print(f"{'':<21}other live bytes before the step: {r['unaccounted'] / MiB:.2f} MiB")
    print("above 1.1x:", ", ".join(f"{m} {ph} {x:.2f}x" for m, ph, x in above) or "none")


if __name__ == "__main__":
    main()
