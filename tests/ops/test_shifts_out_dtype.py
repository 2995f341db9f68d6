"""Bit shifts (<<, >>, bitwise_*_shift) and the out_dtype matmuls on tpu vs CPU.

Shifts by negative amounts or by at least the bit width follow CPU (0, or -1
for a negative signed value shifted right). mm/bmm with out_dtype have only
CUDA kernels in PyTorch; on tpu they are native (compared with f32 math).
"""
from __future__ import annotations

import pytest
import torch

from no_fallback import native


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_shifts_match_cpu(dtype: torch.dtype) -> None:
    a = torch.tensor([1, -3, 5, -128, 7, 100]).to(dtype)
    amounts = [0, 1, 3, 9, 70, 2] if dtype == torch.uint8 else [0, 1, -1, 9, 70, 2]
    s = torch.tensor(amounts).to(dtype)
    cases = [
        lambda x, y: x << y,
        lambda x, y: x >> y,
        lambda x, y: x << 2,
        lambda x, y: torch.bitwise_right_shift(x, 1),
        lambda x, y: torch.bitwise_left_shift(3, y),
    ]
    for f in cases:
        with native():
            got = f(a.to("tpu"), s.to("tpu")).cpu()
        assert torch.equal(got, f(a, s))
    t = a.to("tpu")
    with native():
        t <<= 1
        t >>= s.to("tpu")
    ref = a.clone()
    ref <<= 1
    ref >>= s
    assert torch.equal(t.cpu(), ref)


def test_float_shift_raises_like_cpu() -> None:
    with pytest.raises(RuntimeError):
        torch.ones(2) << 1
    with pytest.raises(RuntimeError):
        torch.ones(2, device="tpu") << 1


def test_mm_bmm_out_dtype() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(3, 8).bfloat16(), torch.randn(8, 5).bfloat16()
    bx, by = torch.randn(2, 3, 8).half(), torch.randn(2, 8, 4).half()
    with native():
        mm = torch.mm(x.to("tpu"), y.to("tpu"), out_dtype=torch.float32)
        bmm = torch.bmm(bx.to("tpu"), by.to("tpu"), out_dtype=torch.float32)
    assert mm.dtype == bmm.dtype == torch.float32
    torch.testing.assert_close(mm.cpu(), x.float() @ y.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(bmm.cpu(), bx.float() @ by.float(), rtol=1e-6, atol=1e-6)
