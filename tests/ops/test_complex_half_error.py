"""torch.complex32 (ComplexHalf, x.chalf()) on tpu: a clear error.

XLA has no complex type with float16 parts, so torch_tpu has no ComplexHalf
storage; every way to make one (conversion, factory, transfer) raises a
RuntimeError naming the dtype and what to use instead, never a crash.
"""
from __future__ import annotations

import pytest
import torch

MESSAGE = r"ComplexHalf \(torch\.complex32 / torch\.chalf\) has no tpu representation.*complex64"


def test_chalf_conversion_factory_and_transfer_raise_a_clear_error() -> None:
    z = torch.randn(4, dtype=torch.complex64, device="tpu")
    with pytest.raises(RuntimeError, match=MESSAGE):
        z.chalf()
    with pytest.raises(RuntimeError, match=MESSAGE):
        torch.zeros(3, dtype=torch.chalf, device="tpu")
    with pytest.raises(RuntimeError, match=MESSAGE):
        torch.ones(2, dtype=torch.complex32).to("tpu")
    # the tpu tensor is still usable afterwards
    torch.testing.assert_close((z * 2).cpu(), z.cpu() * 2)
