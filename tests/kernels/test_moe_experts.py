"""torch_tpu.hub_kernels.moe: the fused experts forward (one jax_op per MoE
layer) registered as a Transformers experts implementation, for Transformers'
own Qwen3-MoE, Mixtral and Gemma 4 experts modules: forward and backward
equal to Transformers' grouped_mm implementation on the CPU (float32,
rtol 1e-5 / atol 1e-5) with either grouped matmul (torch_tpu's tiles,
tokamax.ragged_dot_general), one execution per call, no CPU fallback.
"""
from __future__ import annotations

import pytest
import torch

import torch_tpu

pytest.importorskip("jax")
pytest.importorskip("transformers")

from torch_tpu.hub_kernels import moe  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)


def _experts(kind: str) -> torch.nn.Module:
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts as cls

        cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8)
    elif kind == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts as cls

        cfg = MixtralConfig(hidden_size=32, intermediate_size=16, num_local_experts=8)
    else:
        from transformers import Gemma4TextConfig
        from transformers.models.gemma4.modeling_gemma4 import Gemma4TextExperts as cls

        cfg = Gemma4TextConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8,
                               hidden_activation="gelu_pytorch_tanh")
    torch.manual_seed(0)
    module = cls(cfg)
    torch.nn.init.normal_(module.gate_up_proj, std=0.2)
    torch.nn.init.normal_(module.down_proj, std=0.2)
    return module


def _run(module: torch.nn.Module, impl: str, device: str, inputs: tuple) -> tuple:
    module.config._experts_implementation = impl
    module = module.to(device)
    h, idx, w = (t.detach().clone().to(device) for t in inputs)
    h.requires_grad_(True)
    w.requires_grad_(True)
    out = module(h, idx, w)
    out.square().sum().backward()
    grads = (h.grad, w.grad, module.gate_up_proj.grad, module.down_proj.grad)
    return out.detach().cpu(), [g.cpu() for g in grads]


def _inputs(tokens: int, experts: int = 8, top_k: int = 2) -> tuple:
    g = torch.Generator().manual_seed(tokens)
    h = torch.randn(tokens, 32, generator=g)
    idx = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    w = torch.rand(tokens, top_k, generator=g).softmax(-1)
    return h, idx, w


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral", "gemma4"])
def test_fused_experts_equal_grouped_mm_forward_and_backward(kind: str, grouped: str) -> None:
    moe.register()
    inputs = _inputs(tokens=13)  # uneven groups, some experts empty
    module = _experts(kind)
    assert moe.supports(module)
    ref, ref_grads = _run(_experts(kind), "grouped_mm", "cpu", inputs)
    before = dict(torch_tpu.debug.stats()["fallbacks"])
    calls = torch_tpu.debug.stats()["native_ops"].get("jax_op", 0)
    out, grads = _run(module, moe.IMPLEMENTATION, "tpu", inputs)
    assert dict(torch_tpu.debug.stats()["fallbacks"]) == before, "a CPU fallback ran"
    assert torch_tpu.debug.stats()["native_ops"]["jax_op"] - calls == 2  # forward, vjp
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL)


def test_tokamax_and_tiles_equal_forward_and_backward() -> None:
    """Both grouped matmuls on the same inputs (a transposed Gemma-style layout
    too): equal forward and backward, from different exports (the choice is a
    static argument of the op, so neither reuses the other's executable)."""
    pytest.importorskip("tokamax")
    moe.register()
    inputs = _inputs(tokens=40)  # more rows than one tile for some experts
    op = moe._op()[0]._torch_tpu_jax_op
    try:
        for kind in ("qwen3_moe", "gemma4"):
            results = {}
            for name in ("tiles", "tokamax"):
                moe.use_grouped_matmul(name)
                results[name] = _run(_experts(kind), moe.IMPLEMENTATION, "tpu", inputs)
            texts = {sig[-1][1]: e.text for sig, e in op._exports.items() if sig[0][2] == (40, 32)}
            assert set(texts) == {"tiles", "tokamax"} and texts["tiles"] != texts["tokamax"]
            (a, ga), (b, gb) = results["tiles"], results["tokamax"]
            torch.testing.assert_close(b, a, **TOL)
            for x, y in zip(gb, ga):
                torch.testing.assert_close(x, y, **TOL)
    finally:
        moe.use_grouped_matmul("auto")


def test_grouped_matmul_choice() -> None:
    """"auto" takes tokamax only where its kernel runs: on XLA:CPU (tokamax
    falls back to a dense masked dot over all experts) the tiles; a bad name
    is a clear error."""
    moe.use_grouped_matmul("auto")
    platform = torch.tpu.get_platform()
    expected = "tokamax" if platform in ("tpu", "cuda") and moe._tokamax_installed() else "tiles"
    assert moe.grouped_matmul() == expected
    with pytest.raises(ValueError, match="grouped matmul 'dense'"):
        moe.use_grouped_matmul("dense")


def test_one_execution_per_layer_call_and_all_tokens_on_one_expert() -> None:
    moe.register()
    module = _experts("qwen3_moe").to("tpu")
    module.config._experts_implementation = moe.IMPLEMENTATION
    h, idx, w = _inputs(tokens=64)
    idx[:, 0] = 3  # one expert gets every token: more rows than a tile
    args = (h.to("tpu"), idx.to("tpu"), w.to("tpu"))
    with torch.no_grad():
        module(*args)  # compiles
        torch.tpu.synchronize()
        before = torch_tpu.debug.stats()["executions"]
        out = module(*args)
        torch.tpu.synchronize()
        assert torch_tpu.debug.stats()["executions"] - before == 1  # the whole layer: ONE op
    ref_module = _experts("qwen3_moe")
    ref_module.config._experts_implementation = "grouped_mm"
    with torch.no_grad():
        torch.testing.assert_close(out.cpu(), ref_module(h, idx, w), **TOL)


def test_unsupported_layouts_run_grouped_mm() -> None:
    module = _experts("qwen3_moe")
    module.has_bias = True  # a layout the fused kernel does not cover
    assert not moe.supports(module)


def test_inside_torch_compile() -> None:
    moe.register()
    module = _experts("qwen3_moe")
    h, idx, w = _inputs(tokens=6)
    module.config._experts_implementation = "grouped_mm"
    with torch.no_grad():
        ref = module(h, idx, w)
    module = module.to("tpu")
    module.config._experts_implementation = moe.IMPLEMENTATION
    torch_tpu.compile.reset_stats()
    compiled = torch.compile(lambda *a: module(*a) * 2, backend="tpu", fullgraph=True)
    with torch.no_grad():
        out = compiled(h.to("tpu"), idx.to("tpu"), w.to("tpu"))
    st = torch_tpu.compile.stats()
    assert st["fallback_graphs"] == 0 and st["native_graphs"] == st["graphs"] >= 1, st
    torch.testing.assert_close(out.cpu(), ref * 2, **TOL)
