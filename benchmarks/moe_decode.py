"""Greedy decode of a small Qwen3-MoE-style model: per-step time and executions
per step on tpu for Transformers' experts implementations (``eager``,
``batched_mm``, ``grouped_mm``), torch_tpu's fused experts kernel alone
(``torch_tpu.hub_kernels.moe``: one op per MoE layer for the experts) and the
whole model on torch_tpu's kernels (``dense.kernelize_dense``: the sparse MoE
block with its router as one op, q/k/v projections + q/k head norms + RoPE as
one op, the attention kernel, add + RMSNorm as one op), the kernel rows also
under fused eager (``torch_tpu.fused()``), next to PyTorch CPU eager of the
same model (torch's default intra-op threads, the "vs CPU" baseline, and one
thread), in one run; the "ops alone" row is fused eager with each jax_op ending
the chain and running alone (as before jax_ops joined the chain), the
"tokamax" rows run the grouped matmuls on ``tokamax.ragged_dot_general``
(where tokamax is installed; the default on XLA:CPU is torch_tpu's tiles).
Tokens must be equal across all. "kernel ops/layer"
counts jax_op calls: 1 for the experts (fused experts), 4 for all kernels
(q/k/v + norms + RoPE, attention, add + RMSNorm, the MoE block with router).

    python benchmarks/moe_decode.py [--batch 1 8 64] [--steps 16] [--rounds 3]

Warm numbers: each configuration decodes once to compile, then all are timed
in ``--rounds`` round-robin rounds (same process) and the median is shown.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import torch_tpu
from torch_tpu.hub_kernels import dense, moe

VOCAB = 1024


def _model() -> torch.nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        num_experts=32, num_experts_per_tok=4, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=512, norm_topk_prob=True)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(cfg).eval()


def _sync(device: str) -> None:
    if device == "tpu":
        torch.tpu.synchronize()


def _decode(model: torch.nn.Module, ids: torch.Tensor, steps: int, device: str) -> tuple:
    """(tokens, seconds per decode step, executions per step, jax_op calls per step)."""
    with torch.no_grad():
        out = model(ids, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        tokens = [tok]
        _sync(device)
        stats = torch_tpu.debug.stats()
        e0, f0 = stats["executions"], stats["native_ops"].get("jax_op", 0)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(tok)
        _sync(device)
        dt = (time.perf_counter() - t0) / steps
        stats = torch_tpu.debug.stats()
        execs = (stats["executions"] - e0) / steps if device == "tpu" else 0
        fused = (stats["native_ops"].get("jax_op", 0) - f0) / steps if device == "tpu" else 0
    return torch.cat(tokens, 1).cpu(), dt, execs, fused


def _configurations(cpu: torch.nn.Module, tpu: torch.nn.Module, kernels: torch.nn.Module) -> list:
    """(name, model, device, experts implementation, fused eager, CPU threads,
    jax_ops join the fused chain, grouped matmul)."""
    threads = torch.get_num_threads()
    rows = [(f"PyTorch CPU eager, {threads} threads", cpu, "cpu", "eager", False, threads),
            ("PyTorch CPU eager, 1 thread", cpu, "cpu", "eager", False, 1)]
    rows += [(impl, tpu, "tpu", impl, False, threads) for impl in ("eager", "batched_mm", "grouped_mm")]
    for fuse in (False, True):
        tag = " +fused eager" if fuse else ""
        rows += [("fused experts" + tag, tpu, "tpu", moe.IMPLEMENTATION, fuse, threads),
                 ("all kernels" + tag, kernels, "tpu", moe.IMPLEMENTATION, fuse, threads)]
    # Before jax_ops joined the chain: each kernel ended it and ran alone.
    rows.append(("all kernels +fused, ops alone", kernels, "tpu", moe.IMPLEMENTATION, True,
                 threads, False))
    if moe._tokamax_installed():  # the grouped matmuls on tokamax.ragged_dot_general
        rows += [("fused experts, tokamax", tpu, "tpu", moe.IMPLEMENTATION, False, threads, True,
                  "tokamax"),
                 ("all kernels, tokamax", kernels, "tpu", moe.IMPLEMENTATION, False, threads, True,
                  "tokamax")]
    return rows


def _run(config: tuple, ids: torch.Tensor, steps: int) -> tuple:
    _, model, device, impl, fuse, threads, join, grouped = config + (True, "auto")[len(config) - 6:]
    model.set_experts_implementation(impl)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # on a shared machine, intra-op threads can stall each other
    joined = torch_tpu._C._set_jax_ops_join_fused(join)
    moe.use_grouped_matmul(grouped)
    try:
        with torch_tpu.fused(fuse):
            return _decode(model, ids.to(device), steps, device)
    finally:
        torch.set_num_threads(before)
        torch_tpu._C._set_jax_ops_join_fused(joined)
        moe.use_grouped_matmul("auto")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    moe.register()
    configs = _configurations(_model(), _model().to("tpu"),
                              dense.kernelize_dense(_model().to("tpu")))
    layers = configs[0][1].config.num_hidden_layers
    print(f"Qwen3-MoE-style: {layers} layers, 32 experts, top-4, hidden 256, vocab {VOCAB}; "
          f"{args.steps} greedy decode steps after an {args.prompt}-token prompt; "
          f"median of {args.rounds} round-robin rounds")
    print(f"{'batch':>5} {'implementation':>30} {'ms/step':>9} {'exec/step':>10} "
          f"{'kernel ops/layer':>17} {'vs grouped_mm':>14} {'vs CPU':>7} tokens")
    for batch in args.batch:
        torch.manual_seed(1)
        ids = torch.randint(0, VOCAB, (batch, args.prompt))
        first = [_run(c, ids, args.steps) for c in configs]  # warm: compiles
        times = [[] for _ in configs]
        for _ in range(args.rounds):  # round-robin, so load drift hits every row alike
            for i, c in enumerate(configs):
                times[i].append(_run(c, ids, args.steps)[1])
        med = [statistics.median(t) for t in times]
        ref, cpu_dt = first[0][0], med[0]
        grouped = med[[c[0] for c in configs].index("grouped_mm")]
        for c, (toks, _, execs, ops), dt in zip(configs, first, med):
            execs_s = f"{execs:>10.1f}" if c[2] == "tpu" else f"{'':>10}"
            ops_s = f"{ops / layers:>17.1f}" if c[2] == "tpu" else f"{'':>17}"
            print(f"{batch:>5} {c[0]:>30} {dt * 1e3:>9.1f} {execs_s} {ops_s} {grouped / dt:>13.2f}x "
                  f"{cpu_dt / dt:>6.2f}x {'equal' if torch.equal(toks, ref) else 'DIFFER'}",
                  flush=True)


if __name__ == "__main__":
    main()
