"""F.scaled_dot_product_attention on tpu against CPU's math backend.

tpu picks the "overrideable" SDPA backend, lowered natively (one module for
the forward, one for the backward). Checks masks (bool / additive float,
broadcast), is_causal, GQA, scale, 3-D inputs, fully masked rows, float32 and
bfloat16, forward and backward (q, k, v and the float mask), and dropout
(reproducible, backward consistent with the forward's mask). Zero fallbacks.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch_tpu
from torch.nn.attention import SDPBackend, sdpa_kernel

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOL = {
    torch.float32: {"rtol": 2e-5, "atol": 2e-5},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.debug.stats()["fallbacks"])


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
        device: str, backward: bool, **kw: Any) -> list[torch.Tensor]:
    """Output (and grads of q, k, v and a float mask) on `device`, as CPU tensors."""
    leaves = [t.detach().to(device) for t in (q, k, v)]
    m = mask.detach().to(device) if mask is not None else None
    if backward:
        for t in leaves:
            t.requires_grad_()
        if m is not None and m.is_floating_point():
            m.requires_grad_()
    out = F.scaled_dot_product_attention(*leaves, attn_mask=m, **kw)
    res = [out]
    if backward:
        g = torch.linspace(-1, 1, out.numel(), device=device).view(out.shape).to(out.dtype)
        out.backward(g)
        res += [t.grad for t in leaves]
        if m is not None and m.requires_grad:
            res.append(m.grad)
    return [r.detach().cpu() for r in res]


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
          backward: bool = True, native: bool = True, **kw: Any) -> None:
    dtype = q.dtype
    # Reference: CPU math backend in float32 (from the same rounded inputs).
    up = lambda t: t.float() if t is not None and t.is_floating_point() else t  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):
        expected = run(up(q), up(k), up(v), up(mask), "cpu", backward, **kw)
    torch_tpu.debug.reset_stats()
    actual = run(q, k, v, mask, "tpu", backward, **kw)
    stats = torch_tpu.debug.stats()
    assert not stats["fallbacks"], f"CPU fallbacks: {stats['fallbacks']}"
    if native:
        assert "_scaled_dot_product_efficient_attention" in stats["native_ops"]
    if native and backward:
        assert "_scaled_dot_product_efficient_attention_backward" in stats["native_ops"]
    assert actual[0].dtype == dtype
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.float(), e.float(), equal_nan=True, **TOL[dtype])


def qkv(b: int, hq: int, hk: int, L: int, S: int, e: int, ev: int,
        dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return (torch.randn(b, hq, L, e).to(dtype), torch.randn(b, hk, S, e).to(dtype),
            torch.randn(b, hk, S, ev).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain(dtype: torch.dtype) -> None:
    check(*qkv(2, 3, 3, 5, 7, 8, 6, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bool_mask(dtype: torch.dtype) -> None:
    q, k, v = qkv(2, 2, 2, 4, 6, 8, 8, dtype)
    mask = torch.rand(4, 6) > 0.3
    mask[:, 0] = True
    check(q, k, v, mask)
    check(q, k, v, torch.rand(2, 1, 4, 6) > 0.5)  # with fully masked rows: zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_mask(dtype: torch.dtype) -> None:
    q, k, v = qkv(2, 2, 2, 4, 6, 8, 8, dtype)
    check(q, k, v, torch.randn(2, 1, 4, 6).to(dtype))   # grad reduced over heads
    check(q, k, v, torch.randn(4, 6).to(dtype))
    check(q, k, v, torch.randn(2, 2, 4, 6).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_and_scale(dtype: torch.dtype) -> None:
    check(*qkv(1, 2, 2, 6, 6, 4, 4, dtype), is_causal=True)
    check(*qkv(1, 2, 2, 5, 8, 4, 4, dtype), is_causal=True)  # L != S: top-left aligned
    check(*qkv(1, 2, 2, 5, 8, 4, 4, dtype), scale=0.3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gqa(dtype: torch.dtype) -> None:
    q, k, v = qkv(2, 6, 2, 5, 7, 8, 4, dtype)
    check(q, k, v, enable_gqa=True)
    check(q, k, v, torch.randn(5, 7).to(dtype), enable_gqa=True, is_causal=False)
    check(q, k, v, enable_gqa=True, is_causal=True, scale=0.5)


def test_three_dim_inputs() -> None:
    q, k, v = (t[0] for t in qkv(1, 2, 2, 4, 5, 8, 8, torch.float32))
    check(q, k, v)
    check(q, k, v, torch.rand(4, 5) > 0.2)


def test_no_grad_inference() -> None:
    q, k, v = qkv(1, 2, 2, 3, 3, 4, 4, torch.float32)
    with torch.no_grad():
        check(q, k, v, backward=False, is_causal=True)


def test_gqa_without_flag_raises_like_cpu() -> None:
    q, k, v = qkv(1, 4, 2, 3, 3, 4, 4, torch.float32)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu")).cpu()


def test_fused_sdp_choice() -> None:
    q = torch.randn(1, 2, 3, 4, device="tpu")
    assert torch._fused_sdp_choice(q, q, q) == SDPBackend.OVERRIDEABLE.value
    with sdpa_kernel(SDPBackend.MATH):
        assert torch._fused_sdp_choice(q, q, q) == SDPBackend.MATH.value


def _keep_mask(b: int, hq: int, L: int, S: int, p: float, seed: int) -> torch.Tensor:
    """The dropout keep mask the tpu draws for these shapes after manual_seed(seed):
    with q = k = 0 the probabilities are 1/S, and v = I reads them out."""
    torch.manual_seed(seed)
    q = torch.zeros(b, hq, L, 4, device="tpu")
    v = torch.eye(S, device="tpu").expand(b, hq, S, S).contiguous()
    out = F.scaled_dot_product_attention(q, torch.zeros(b, hq, S, 4, device="tpu"), v,
                                         dropout_p=p).cpu()
    return out * (1 - p) * S > 0.5


def test_dropout_reproducible_and_consistent() -> None:
    b, hq, L, S, p = 2, 2, 5, 6, 0.4
    keep = _keep_mask(b, hq, L, S, p, seed=7)
    frac = keep.float().mean().item()
    assert 0.3 < frac < 0.9, frac
    assert torch.equal(keep, _keep_mask(b, hq, L, S, p, seed=7))   # reproducible
    assert not torch.equal(keep, _keep_mask(b, hq, L, S, p, seed=8))

    # Same seed and shapes: the same mask, in the forward and in the backward.
    q, k, v = qkv(b, hq, hq, L, S, 8, 3, torch.float32)
    g = torch.randn(b, hq, L, 3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    scores = (leaves[0] @ leaves[1].transpose(-1, -2)) / 8 ** 0.5
    ref = (scores.softmax(-1) * keep / (1 - p)) @ leaves[2]
    ref.backward(g)
    torch.manual_seed(7)
    torch_tpu.debug.reset_stats()
    tl = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*tl, dropout_p=p)
    out.backward(g.to("tpu"))
    assert not torch_tpu.debug.stats()["fallbacks"]
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), **TOL[torch.float32])
    for t, r in zip(tl, leaves):
        torch.testing.assert_close(t.grad.cpu(), r.grad, **TOL[torch.float32])


def test_empty() -> None:
    q, k, v = qkv(0, 2, 2, 3, 4, 4, 4, torch.float32)
    check(q, k, v, backward=False, native=False)  # sdpa returns before any kernel
