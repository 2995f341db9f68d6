"""Greedy decode of a small dense Llama: per-step time and executions per step
on tpu for Transformers' default implementation (SDPA attention, eager
RMSNorm / RoPE / MLP), torch_tpu's attention kernel alone
(``torch_tpu.hub_kernels.attention``) and all dense kernels
(``torch_tpu.hub_kernels.dense.kernelize_dense``: attention, RoPE, add +
RMSNorm, gated MLP, one op each), each also under fused eager
(``torch_tpu.fused()``), next to PyTorch CPU eager of the same model, in one
run. Tokens must be equal across all.

    python benchmarks/dense_decode.py [--batch 1 8 64] [--steps 16]

Warm numbers: each configuration decodes once to compile, then is timed.
The cache is Transformers' default DynamicCache. PyTorch CPU eager runs with
torch's default intra-op threads (the "vs CPU" baseline) and with one thread.
"""
from __future__ import annotations

import argparse
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


def _configurations(default: torch.nn.Module, kernels: torch.nn.Module) -> list:
    """(name, model, attention implementation, fused eager) in the order they run."""
    rows = []
    for fuse in (False, True):
        tag = " +fused eager" if fuse else ""
        rows += [("default (sdpa)" + tag, default, "sdpa", fuse),
                 ("attention kernel" + tag, default, attention.IMPLEMENTATION, fuse),
                 ("all dense kernels" + tag, kernels, attention.IMPLEMENTATION, fuse)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=8)
    args = ap.parse_args()
    attention.register()
    cpu_model = _model()
    default = _model().to("tpu")
    kernels = dense.kernelize_dense(_model().to("tpu"))
    layers = default.config.num_hidden_layers
    print(f"dense Llama: {layers} layers, hidden 256, MLP 768, 8 heads / 4 KV heads, vocab {VOCAB}; "
          f"{args.steps} greedy decode steps after a {args.prompt}-token prompt (DynamicCache)")
    print(f"{'batch':>5} {'implementation':>31} {'ms/step':>9} {'exec/step':>10} "
          f"{'kernel ops/layer':>17} {'vs default':>11} {'vs CPU':>7} tokens")
    for batch in args.batch:
        torch.manual_seed(1)
        ids = torch.randint(0, VOCAB, (batch, args.prompt))
        ref, cpu_dt, _, _ = _decode(cpu_model, ids, args.steps, "cpu")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # on a shared machine, intra-op threads can stall each other
        one, cpu1_dt, _, _ = _decode(cpu_model, ids, args.steps, "cpu")
        torch.set_num_threads(threads)
        rows = []
        for name, model, impl, fuse in _configurations(default, kernels):
            model.set_attn_implementation(impl)
            with torch_tpu.fused(fuse):
                _decode(model, ids.to("tpu"), args.steps, "tpu")  # warm: compiles
                toks, dt, execs, ops = _decode(model, ids.to("tpu"), args.steps, "tpu")
            rows.append((name, dt, execs, ops / layers, torch.equal(toks, ref)))
        base = rows[0][1]
        print(f"{batch:>5} {f'PyTorch CPU eager, {threads} threads':>31} {cpu_dt * 1e3:>9.1f} {'':>10} "
              f"{'':>17} {base / cpu_dt:>10.2f}x {1.0:>6.2f}x ref")
        print(f"{batch:>5} {'PyTorch CPU eager, 1 thread':>31} {cpu1_dt * 1e3:>9.1f} {'':>10} {'':>17} "
              f"{base / cpu1_dt:>10.2f}x {cpu_dt / cpu1_dt:>6.2f}x "
              f"{'equal' if torch.equal(one, ref) else 'DIFFER'}")
        for name, dt, execs, per_layer, same in rows:
            print(f"{batch:>5} {name:>31} {dt * 1e3:>9.1f} {execs:>10.1f} {per_layer:>17.1f} "
                  f"{base / dt:>10.2f}x {cpu_dt / dt:>6.2f}x {'equal' if same else 'DIFFER'}",
                  flush=True)


if __name__ == "__main__":
    main()
