"""Greedy decode of a small Qwen3-MoE-style model: per-step time and executions
per step for Transformers' experts implementations on tpu (``eager``,
``batched_mm``, ``grouped_mm``) and torch_tpu's fused kernel
(``torch_tpu.hub_kernels.moe``, one op per MoE layer; also under fused eager,
``torch_tpu.fused()``), next to PyTorch CPU eager of the same model, in one
run. Tokens must be equal across all.

    python benchmarks/moe_decode.py [--batch 1 8 64] [--steps 16]

Warm numbers: each configuration decodes once to compile, then is timed.
"""
from __future__ import annotations

import argparse
import time

import torch

import torch_tpu
from torch_tpu.hub_kernels import moe


def _model() -> torch.nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        num_experts=32, num_experts_per_tok=4, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=512, norm_topk_prob=True)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(cfg).eval()


def _sync(device: str) -> None:
    if device == "tpu":
        torch.tpu.synchronize()


def _decode(model: torch.nn.Module, ids: torch.Tensor, steps: int, device: str) -> tuple:
    """(tokens, seconds per decode step, executions per step, fused ops per step)."""
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=8)
    args = ap.parse_args()
    moe.register()
    cpu_model = _model()
    tpu_model = _model().to("tpu")
    layers = tpu_model.config.num_hidden_layers
    impls = ["eager", "batched_mm", "grouped_mm", moe.IMPLEMENTATION]
    print(f"Qwen3-MoE-style: {layers} layers, 32 experts, top-4, hidden 256; "
          f"{args.steps} greedy decode steps after an {args.prompt}-token prompt")
    print(f"{'batch':>5} {'implementation':>29} {'ms/step':>9} {'exec/step':>10} "
          f"{'experts ops/layer':>18} {'vs grouped_mm':>14} {'vs CPU':>7} tokens")
    for batch in args.batch:
        torch.manual_seed(1)
        ids = torch.randint(0, 1024, (batch, args.prompt))
        cpu_model.set_experts_implementation("eager")
        ref, cpu_dt, _, _ = _decode(cpu_model, ids, args.steps, "cpu")
        rows = []
        for impl, fuse in [(i, False) for i in impls] + [(moe.IMPLEMENTATION, True)]:
            tpu_model.set_experts_implementation(impl)
            with torch_tpu.fused(fuse):
                _decode(tpu_model, ids.to("tpu"), args.steps, "tpu")  # warm: compiles
                toks, dt, execs, fused = _decode(tpu_model, ids.to("tpu"), args.steps, "tpu")
            name = impl + (" +fused eager" if fuse else "")
            rows.append((name, dt, execs, fused / layers, torch.equal(toks, ref)))
        grouped = dict((r[0], r[1]) for r in rows)["grouped_mm"]
        print(f"{batch:>5} {'CPU eager':>29} {cpu_dt * 1e3:>9.1f} {'':>10} {'':>18} "
              f"{grouped / cpu_dt:>13.2f}x {1.0:>6.2f}x ref")
        for impl, dt, execs, per_layer, same in rows:
            print(f"{batch:>5} {impl:>29} {dt * 1e3:>9.1f} {execs:>10.1f} {per_layer:>18.1f} "
                  f"{grouped / dt:>13.2f}x {cpu_dt / dt:>6.2f}x {'equal' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
