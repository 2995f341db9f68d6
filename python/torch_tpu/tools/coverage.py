"""Op coverage: which ATen ops a program dispatched on tpu, native or CPU fallback.

Usage::

    python -m torch_tpu.tools.coverage script.py [args...]
    python -m torch_tpu.tools.coverage --model llama   # a built-in tiny model (tiny_models.py)

It runs the program with torch_tpu's counters reset and prints every ATen op
that reached the tpu backend with its call count, marked ``native`` (a
lowering rule ran) or ``FALLBACK`` (the CPU fallback ran), then the totals.
``--json FILE`` also writes the table as JSON. The exit status is 0; use
``--fail-on-fallback`` to make any fallback an error (for CI gates).
"""
from __future__ import annotations

import argparse
import json
import runpy
import sys
from typing import Any

import torch

import torch_tpu


def collect() -> dict[str, Any]:
    """The counters of the current process as a coverage table."""
    s = torch_tpu.debug.stats()
    rows = [{"op": op, "calls": n, "native": True} for op, n in s["native_ops"].items()]
    rows += [{"op": op, "calls": n, "native": False} for op, n in s["fallbacks"].items()]
    rows.sort(key=lambda r: (r["native"], -r["calls"], r["op"]))
    return {
        "ops": rows,
        "native_calls": sum(s["native_ops"].values()),
        "fallback_calls": sum(s["fallbacks"].values()),
        "compiles": s["compiles"],
    }


def format_table(table: dict[str, Any]) -> str:
    lines = [f"{'op':<48} {'calls':>8}  kind"]
    for r in table["ops"]:
        lines.append(f"{r['op']:<48} {r['calls']:>8}  {'native' if r['native'] else 'FALLBACK'}")
    native_ops = sum(1 for r in table["ops"] if r["native"])
    fallback_ops = len(table["ops"]) - native_ops
    lines.append(f"{native_ops} ops native ({table['native_calls']} calls), {fallback_ops} ops "
                 f"through the CPU fallback ({table['fallback_calls']} calls), "
                 f"{table['compiles']} compiles")
    return "\n".join(lines)


def _builtin_model(name: str) -> None:
    """Forward and one AdamW step of a tiny Transformers model on tpu."""
    from . import tiny_models

    if name not in tiny_models.MODELS:
        raise SystemExit(f"unknown model {name!r}; choose one of {', '.join(tiny_models.MODELS)}")
    model, inputs = tiny_models.make(name)
    model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = model(**tiny_models.to(inputs, "tpu"))
    out.loss.backward()
    opt.step()
    torch.tpu.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_tpu.tools.coverage",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a built-in tiny Transformers model: llama, qwen3, qwen3_moe, "
                        "gemma3, mistral, gpt2, bert, t5, vit, whisper, clip (torch_tpu.tools.tiny_models)")
    parser.add_argument("--json", help="also write the table to this file")
    parser.add_argument("--fail-on-fallback", action="store_true")
    parser.add_argument("script", nargs="?", help="a Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if not ns.model and not ns.script:
        parser.error("give a script or --model")
    torch_tpu.debug.reset_stats()
    if ns.model:
        _builtin_model(ns.model)
    else:
        sys.argv = [ns.script] + ns.args
        runpy.run_path(ns.script, run_name="__main__")
        torch.tpu.synchronize()
    table = collect()
    print(format_table(table))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(table, f, indent=2)
    return 1 if ns.fail_on_fallback and table["fallback_calls"] else 0


if __name__ == "__main__":
    sys.exit(main())
