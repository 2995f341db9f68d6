"""Hugging Face on "tpu": save a tiny Llama, load it with device_map="tpu", generate.

    python demo/hf_generate.py [--new-tokens 16] [--dir DIR]

Builds a tiny Llama-style model from a config (random weights, no hub),
saves it with save_pretrained (safetensors), loads it back twice, on CPU and
with device_map="tpu", generates greedily with both (DynamicCache, then
StaticCache), checks the tokens are equal, and prints the timings and
torch_tpu.debug.report(). The only difference from a CUDA script is the
device string.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402  (autoloads torch_tpu)
import torch_tpu  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import is_torch_tpu_available  # noqa: E402


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--dir", default=None, help="where to save the model (default: a temporary folder)")
    args = ap.parse_args()

    print(f"torch {torch.__version__}, torch_tpu platform {torch_tpu.get_platform()!r}, "
          f"transformers.utils.is_torch_tpu_available() = {is_torch_tpu_available()}")
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    path = args.dir or tempfile.mkdtemp(prefix="tiny-llama-")
    LlamaForCausalLM(config).save_pretrained(path)
    print(f"saved a tiny Llama ({sum(p.numel() for p in LlamaForCausalLM(config).parameters())} params) to {path}")

    cpu = AutoModelForCausalLM.from_pretrained(path)
    tpu, t_load = timed(lambda: AutoModelForCausalLM.from_pretrained(path, device_map="tpu"))
    print(f"from_pretrained(device_map='tpu'): {t_load:.2f} s, model on {tpu.device}")

    prompt = torch.tensor([[1, 17, 42, 99, 7, 3, 250, 64]])
    ok = True
    torch_tpu.debug.reset_stats()
    for label, kw in [("DynamicCache", {}), ("StaticCache", {"cache_implementation": "static"})]:
        gen = dict(max_new_tokens=args.new_tokens, do_sample=False, **kw)
        ref, t_cpu = timed(lambda: cpu.generate(prompt, **gen))
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            first, t_first = timed(lambda: tpu.generate(prompt.to("tpu"), **gen).cpu())
            again, t_again = timed(lambda: tpu.generate(prompt.to("tpu"), **gen).cpu())
        for w in rec:
            if str(w.message).startswith("torch_tpu:"):
                print(f"  note: {w.message}")
        equal = first.tolist() == ref.tolist() == again.tolist()
        ok &= equal
        print(f"\n[{label}] greedy, {args.new_tokens} new tokens")
        print(f"  cpu tokens: {ref[0, prompt.shape[1]:].tolist()}")
        print(f"  tpu tokens: {first[0, prompt.shape[1]:].tolist()}")
        print(f"  equal to CPU: {equal}")
        print(f"  cpu {t_cpu:.3f} s | tpu first call {t_first:.3f} s (compiles each op once) | tpu again {t_again:.3f} s")

    print()
    torch_tpu.debug.report()  # prints
    print("\nOK: tpu tokens equal CPU's" if ok else "\nMISMATCH between tpu and CPU tokens")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
