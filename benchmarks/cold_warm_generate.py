"""Cold vs warm start: the first 32 greedy tokens of a tiny Llama on "tpu".

A tiny Llama (random weights, saved once with save_pretrained to a temporary
directory) is loaded with ``from_pretrained(path, device_map="tpu")`` and
generates 32 tokens greedily, in a child process, twice, with the SAME fresh
``TORCH_TPU_CACHE_DIR``: the first run starts cold (empty disk cache: every
executable is compiled), the second warm (every executable comes from the disk
cache). For each run it reports the wall time from process start to the 32nd
token (interpreter start, imports, load and generate), the generate() time
alone, and the child's ``torch_tpu.debug.stats()`` (compiles, disk_hits);
then the warm/cold ratios. The issue's bar: warm under 20% of cold.

A warm process also starts loading the executables its previous run used on
a background thread as soon as torch_tpu initializes (the disk cache's
prefetch manifest), overlapping the imports; the "prefetched" column counts
them (``TORCH_TPU_CACHE_PREFETCH=0`` turns it off, for comparison).

``--cache static`` uses a StaticCache, with which generate() compiles the
decoding step with torch.compile (backend "tpu"); the default DynamicCache
runs strict eager.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

NEW_TOKENS = 32


def build_model(path, args):
    """Saves the tiny Llama (random weights, seeded) to `path`."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256)
    tf.LlamaForCausalLM(cfg).eval().save_pretrained(path)


def child(args):
    """One load + generate, timed from process start; prints one JSON line."""
    t_imports = time.time()
    import torch
    import transformers as tf
    # Transformers imports lazily: pull in what from_pretrained / generate()
    # use now, so that "load" is the loading work (imports are not ours).
    import transformers.generation.utils  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    import torch_tpu
    import torch_tpu.compile
    if args.cache == "static":
        # generate() will torch.compile: PyTorch imports Dynamo and
        # AOTAutograd (about 2 s here) on first use. Same work cold and warm.
        import torch._dynamo  # noqa: F401
        import torch._functorch.aot_autograd  # noqa: F401
        import torch._dynamo.backends.debugging  # noqa: F401
        # The key of PyTorch's AOTAutograd cache (which keeps the traced
        # graphs) covers Inductor's settings: PyTorch imports its code
        # generators for it (about 0.5 s here). Same work cold and warm.
        from torch._inductor.codegen.common import init_backend_registration
        init_backend_registration()

    t_load = time.time()
    model = tf.AutoModelForCausalLM.from_pretrained(args.model_dir, device_map="tpu")
    ids = torch.arange(3, 3 + args.prompt).remainder(args.vocab).unsqueeze(0)
    kw = {"cache_implementation": "static"} if args.cache == "static" else {}
    t_gen = time.time()
    out = model.generate(ids.to("tpu"), attention_mask=torch.ones_like(ids).to("tpu"),
                         max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                         **kw)
    tokens = out.cpu()[0, args.prompt:].tolist()  # waits for the 32nd token
    t_end = time.time()
    assert len(tokens) == NEW_TOKENS, tokens
    start = float(os.environ["COLD_WARM_T0"])
    s = torch_tpu.debug.stats()
    print("RESULT " + json.dumps({
        "total": t_end - start,
        "startup": t_imports - start,
        "imports": t_load - t_imports,
        "load": t_gen - t_load,
        "generate": t_end - t_gen,
        "compiles": s["compiles"],
        "disk_hits": s.get("disk_hits", 0),
        "disk_misses": s.get("disk_misses", 0),
        "disk_prefetched": s.get("disk_prefetched", 0),
        "compile_seconds": s["compile_seconds"],
        "fallbacks": sum(s["fallbacks"].values()),
        "graphs": {k: v for k, v in torch_tpu.compile.stats().items() if v},
        "tokens": tokens,
    }), flush=True)


def run_child(args, cache_dir):
    # PyTorch's own cache directory (its AOTAutograd cache holds the traced
    # graphs of torch.compile) is fresh too, next to ours.
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache_dir,
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "torch"))
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", "--model-dir", args.model_dir,
           "--cache", args.cache, "--prompt", str(args.prompt), "--vocab", str(args.vocab)]
    env["COLD_WARM_T0"] = repr(time.time())
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("the generation child failed:\n" + proc.stderr[-4000:])
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError("the generation child printed no result:\n" + proc.stdout[-2000:])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default="dynamic", choices=["dynamic", "static"],
                   help="KV cache: dynamic (strict eager) or static (generate() auto-compiles)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--prompt", type=int, default=8, help="prompt length (tokens)")
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="cold_warm_") as tmp:
        args.model_dir = os.path.join(tmp, "model")
        cache_dir = os.path.join(tmp, "torch_tpu_cache")
        os.makedirs(cache_dir)
        # Built in a child too, so this process never loads torch_tpu.
        subprocess.run([sys.executable, "-c",
                        "import sys; sys.path.insert(0, %r); import cold_warm_generate as c, "
                        "argparse; c.build_model(%r, argparse.Namespace(**%r))"
                        % (os.path.dirname(os.path.abspath(__file__)), args.model_dir,
                           {k: getattr(args, k) for k in ("vocab", "hidden", "layers")})],
                       check=True, env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
        cold = run_child(args, cache_dir)
        warm = run_child(args, cache_dir)
    if cold["tokens"] != warm["tokens"]:
        raise SystemExit("cold and warm runs generated different tokens")
    print(f"tiny Llama ({args.layers} layers, hidden {args.hidden}, vocab {args.vocab}), "
          f"{args.cache} cache, prompt {args.prompt}, {NEW_TOKENS} new tokens (greedy), "
          f"one fresh TORCH_TPU_CACHE_DIR")
    print(f"{'run':<6}{'start->32nd token s':>21}{'python+imports s':>18}{'load s':>8}"
          f"{'generate s':>12}{'compiles':>10}{'disk_hits':>11}{'prefetched':>12}{'compile s':>11}")
    for name, r in (("cold", cold), ("warm", warm)):
        print(f"{name:<6}{r['total']:>21.2f}{r['startup'] + r['imports']:>18.2f}{r['load']:>8.2f}"
              f"{r['generate']:>12.2f}{r['compiles']:>10}{r['disk_hits']:>11}"
              f"{r['disk_prefetched']:>12}{r['compile_seconds']:>11.2f}")
    total = warm["total"] / cold["total"]
    after = (warm["load"] + warm["generate"]) / (cold["load"] + cold["generate"])
    gen = warm["generate"] / cold["generate"]
    print(f"warm/cold: start->32nd token {total:.0%}, load+generate {after:.0%}, "
          f"generate() alone {gen:.0%} (bar: under 20%)")
    if cold["graphs"]:
        print(f"torch.compile graphs: cold {cold['graphs']}, warm {warm['graphs']}")
    print(f"CPU fallbacks: cold {cold['fallbacks']}, warm {warm['fallbacks']}; python+imports "
          f"(torch, transformers) is the same work in both runs and not torch_tpu's")


if __name__ == "__main__":
    main()
