"""Greedy decode of a small dense Llama: per-step time and executions per step
on tpu for Transformers' default implementation (SDPA attention, eager
RMSNorm / RoPE / MLP), torch_tpu's attention kernel alone
(``torch_tpu.hub_kernels.attention``) and all dense kernels
(``torch_tpu.hub_kernels.dense.kernelize_dense``: attention, RoPE, add +
RMSNorm, gated MLP, one op each), each also under fused eager
(``torch_tpu.fused()``), next to PyTorch CPU eager of the same model, in one
run; the "ops alone" row is fused eager with each jax_op ending the chain and
running alone (as before jax_ops joined the chain). Tokens must be equal
across all.

    python benchmarks/dense_decode.py [--batch 1 8 64] [--steps 16]

Warm numbers: each configuration decodes once to compile, then all are timed
in ``--rounds`` round-robin rounds and the median is shown.
The cache is Transformers' default DynamicCache. PyTorch CPU eager runs with
torch's default intra-op threads (the "vs CPU" baseline) and with one thread.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import torch_tpu
from torch_tpu.hub_kernels import attention, dense

VOCAB = 1024


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=768,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=32, max_position_embeddings=512)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _sync(device: str) -> None:
    if device == "tpu":
        torch.tpu.synchronize()


def _decode(model: torch.nn.Module, ids: torch.Tensor, steps: int, device: str) -> tuple:
    """(tokens, seconds per decode step, executions per step, jax_op calls per step)."""
    with torch.no_grad():
        out = model(ids, use_cache=True)
        past, tok = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        tokens = [tok]
        _sync(device)
        stats = torch_tpu.debug.stats()
        e0, f0 = stats["executions"], stats["native_ops"].get("jax_op", 0)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(tok, cache=past, use_cache=True)
            past, tok = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(tok)
        _sync(device)
        dt = (time.perf_counter() - t0) / steps
        stats = torch_tpu.debug.stats()
        execs = (stats["executions"] - e0) / steps if device == "tpu" else 0
        fused = (stats["native_ops"].get("jax_op", 0) - f0) / steps if device == "tpu" else 0
    return torch.cat(tokens, 1).cpu(), dt, execs, fused


def _configurations(cpu: torch.nn.Module, default: torch.nn.Module,
                    kernels: torch.nn.Module) -> list:
    """(name, model, device, attention implementation, fused eager, CPU threads)."""
    threads = torch.get_num_threads()
    rows = [(f"PyTorch CPU eager, {threads} threads", cpu, "cpu", "sdpa", False, threads),
            ("PyTorch CPU eager, 1 thread", cpu, "cpu", "sdpa", False, 1)]
    for fuse in (False, True):
        tag = " +fused eager" if fuse else ""
        rows += [("default (sdpa)" + tag, default, "tpu", "sdpa", fuse, threads),
                 ("attention kernel" + tag, default, "tpu", attention.IMPLEMENTATION, fuse, threads),
                 ("all dense kernels" + tag, kernels, "tpu", attention.IMPLEMENTATION, fuse, threads)]
    # Before jax_ops joined the chain: each kernel ended it and ran alone.
    rows.append(("all dense kernels +fused, ops alone", kernels, "tpu", attention.IMPLEMENTATION,
                 True, threads, False))
    return rows


def _run(config: tuple, ids: torch.Tensor, steps: int) -> tuple:
    _, model, device, impl, fuse, threads, join = config + (True,)[len(config) - 6:]
    model.set_attn_implementation(impl)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # on a shared machine, intra-op threads can stall each other
    joined = torch_tpu._C._set_jax_ops_join_fused(join)
    try:
        with torch_tpu.fused(fuse):
            return _decode(model, ids.to(device), steps, device)
    finally:
        torch.set_num_threads(before)
        torch_tpu._C._set_jax_ops_join_fused(joined)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    attention.register()
    configs = _configurations(_model(), _model().to("tpu"),
                              dense.kernelize_dense(_model().to("tpu")))
    layers = configs[0][1].config.num_hidden_layers
    print(f"dense Llama: {layers} layers, hidden 256, MLP 768, 8 heads / 4 KV heads, vocab {VOCAB}; "
          f"{args.steps} greedy decode steps after a {args.prompt}-token prompt (DynamicCache); "
          f"median of {args.rounds} round-robin rounds")
    print(f"{'batch':>5} {'implementation':>35} {'ms/step':>9} {'exec/step':>10} "
          f"{'kernel ops/layer':>17} {'vs default':>11} {'vs CPU':>7} tokens")
    for batch in args.batch:
        torch.manual_seed(1)
        ids = torch.randint(0, VOCAB, (batch, args.prompt))
        first = [_run(c, ids, args.steps) for c in configs]  # warm: compiles
        times = [[] for _ in configs]
        for _ in range(args.rounds):  # round-robin, so load drift hits every row alike
            for i, c in enumerate(configs):
                times[i].append(_run(c, ids, args.steps)[1])
        med = [statistics.median(t) for t in times]
        ref, base, cpu_dt = first[0][0], med[2], med[0]
        for c, (toks, _, execs, ops), dt in zip(configs, first, med):
            execs_s = f"{execs:>10.1f}" if c[2] == "tpu" else f"{'':>10}"
            ops_s = f"{ops / layers:>17.1f}" if c[2] == "tpu" else f"{'':>17}"
            print(f"{batch:>5} {c[0]:>35} {dt * 1e3:>9.1f} {execs_s} {ops_s} {base / dt:>10.2f}x "
                  f"{cpu_dt / dt:>6.2f}x {'equal' if torch.equal(toks, ref) else 'DIFFER'}",
                  flush=True)


if __name__ == "__main__":
    main()
