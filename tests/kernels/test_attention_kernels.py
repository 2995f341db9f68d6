"""torch_tpu.hub_kernels.attention: decode attention over a KV cache and
flash-style (blockwise, online-softmax) prefill attention, each ONE op.

References are PyTorch's CPU SDPA / eager attention (KV heads repeated for
GQA). Tolerances: float32 rtol 1e-5 / atol 1e-5 (gradients 1e-4), bfloat16
rtol / atol 2e-2 (bf16 rounding of the probabilities before P @ V). Every
tpu run asserts zero CPU fallbacks.
"""
from __future__ import annotations

import pytest
import torch

import torch_tpu

pytest.importorskip("jax")
pytest.importorskip("transformers")

from torch_tpu.hub_kernels import attention  # noqa: E402

F32 = dict(rtol=1e-5, atol=1e-5)
BF16 = dict(rtol=2e-2, atol=2e-2)


class native:  # noqa: N801
    def __enter__(self) -> None:
        self.before = dict(torch_tpu.debug.stats()["fallbacks"])

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            assert dict(torch_tpu.debug.stats()["fallbacks"]) == self.before, "a CPU fallback ran"


def _reference(q, k, v, keep, scaling=None, softcap=0.0):
    """Eager attention on CPU: (B, Sq, H, D); rows with no key give 0."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q.float() @ k.float().transpose(-1, -2)) * (scaling or q.shape[-1] ** -0.5)
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.nan_to_num(s.softmax(-1), nan=0.0).to(v.dtype)
    return (p.float() @ v.float()).to(q.dtype).transpose(1, 2)


def _keep(b, sq, sk, window=0, pad=0):
    """Causal keep-mask with the queries at the end; the first ``pad`` keys of
    batch row 0 are padding; ``window`` > 0 adds a sliding window."""
    qpos = torch.arange(sq)[:, None] + sk - sq
    kpos = torch.arange(sk)[None, :]
    keep = kpos <= qpos
    if window:
        keep = keep & (qpos - kpos < window)
    keep = keep[None, None].expand(b, 1, sq, sk).clone()
    keep[0, :, :, :pad] = False
    return keep


def _qkv(b, h, hkv, sq, sk, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype) for s in ((b, h, sq, d), (b, hkv, sk, d),
                                                             (b, hkv, sk, d))]


@pytest.mark.parametrize("kernel", ["decode", "flash"])
def test_gqa_with_padding_mask_forward_and_backward(kernel: str) -> None:
    sq, sk = (2, 11) if kernel == "decode" else (11, 11)
    q, k, v = _qkv(2, 4, 2, sq, sk)
    keep = _keep(2, sq, sk, pad=3)
    fn = attention.decode_attention if kernel == "decode" else \
        lambda *a, **kw: attention.flash_attention(*a, block=4, **kw)  # 3 blocks, last one ragged
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = _reference(*leaves, keep)
    ref.square().sum().backward()
    tpu = [t.to("tpu").requires_grad_(True) for t in (q, k, v)]
    with native():
        out = fn(*tpu, keep.to("tpu"), causal=False)
        out.square().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), **F32)
    for t, r in zip(tpu, leaves):
        torch.testing.assert_close(t.grad.cpu(), r.grad, rtol=1e-4, atol=1e-4)


def test_mask_skipped_causal_sliding_window_softcap_and_bf16() -> None:
    q, k, v = _qkv(1, 4, 1, 9, 9, seed=1)
    with native():
        for window, softcap in [(0, 0.0), (3, 0.0), (0, 5.0)]:
            keep = _keep(1, 9, 9, window=window)
            ref = _reference(q, k, v, keep, softcap=softcap)
            for fn in (attention.decode_attention, attention.flash_attention):
                out = fn(q.to("tpu"), k.to("tpu"), v.to("tpu"), None, causal=True, window=window,
                         softcap=softcap)
                torch.testing.assert_close(out.cpu(), ref, **F32)
        qb, kb, vb = (t.bfloat16() for t in (q, k, v))
        outs = [fn(qb.to("tpu"), kb.to("tpu"), vb.to("tpu"), None)
                for fn in (attention.decode_attention, attention.flash_attention)]
    for out in outs:
        torch.testing.assert_close(out.cpu().float(), _reference(qb, kb, vb, _keep(1, 9, 9)).float(),
                                   **BF16)


def test_one_execution_and_inside_torch_compile() -> None:
    q, k, v = (t.to("tpu") for t in _qkv(2, 4, 2, 1, 16, seed=2))
    attention.decode_attention(q, k, v)  # compiles
    torch.tpu.synchronize()
    before = torch_tpu.debug.stats()["executions"]
    out = attention.decode_attention(q, k, v)
    torch.tpu.synchronize()
    assert torch_tpu.debug.stats()["executions"] - before == 1
    torch_tpu.compile.reset_stats()
    compiled = torch.compile(lambda *a: attention.decode_attention(*a) * 2, backend="tpu",
                             fullgraph=True)
    with native():
        twice = compiled(q, k, v)
    st = torch_tpu.compile.stats()
    assert st["fallback_graphs"] == 0 and st["native_graphs"] == st["graphs"] >= 1, st
    torch.testing.assert_close(twice.cpu(), out.cpu() * 2, **F32)


def test_bad_shapes_raise_clear_errors() -> None:
    q, k, v = _qkv(1, 3, 2, 1, 4)
    with pytest.raises(ValueError, match="query heads cannot share"):
        attention.decode_attention(q, k, v)
    with pytest.raises(ValueError, match="must be 4-D"):
        attention.flash_attention(*_qkv(1, 2, 1, 1, 4), torch.ones(4, dtype=torch.bool))


def _tiny_mistral():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        sliding_window=4)
    torch.manual_seed(0)
    return MistralForCausalLM(cfg).eval()


def test_static_cache_sliding_window_generate_with_padding_equals_default() -> None:
    """Greedy tokens of a sliding-window (4) Mistral with a StaticCache and a
    left-padded batch, prompt longer than the window (the mask holds the
    window, the padding and the unfilled cache slots): registry path == SDPA
    on CPU."""
    ref = _tiny_mistral()
    model = _tiny_mistral().to("tpu")
    model.set_attn_implementation(attention.register())
    ids = torch.randint(1, 96, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    kw = dict(max_new_tokens=3, do_sample=False, cache_implementation="static", pad_token_id=0,
              disable_compile=True)
    with torch.no_grad():
        expected = ref.generate(ids, attention_mask=mask, **kw)
        with native():
            got = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), **kw)
    assert torch.equal(got.cpu(), expected)
