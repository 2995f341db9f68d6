"""frexp natively, bit-exact with CPU: normals, subnormals, zeros, inf/NaN, bf16, out=."""
import pytest
import torch
from no_fallback import native

import torch_tpu  # noqa: F401

SPECIAL = [0.0, -0.0, 1.0, -3.5, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-42,
           1.4e-45, 1.17549435e-38, -2.5e-39, 3e38, 6.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frexp_bit_exact(dtype):
    torch.manual_seed(0)
    x = torch.cat([torch.tensor(SPECIAL), torch.randn(500) * 100, torch.randn(50) * 1e-39]).to(dtype)
    m, e = torch.frexp(x)
    with native():
        mt, et = torch.frexp(x.to("tpu"))
    assert (mt.dtype, et.dtype) == (m.dtype, e.dtype)
    torch.testing.assert_close(mt.cpu(), m, rtol=0, atol=0, equal_nan=True)
    number = ~m.isnan()
    assert torch.equal(mt.cpu().signbit()[number], m.signbit()[number])  # -0.0 stays -0.0
    assert torch.equal(et.cpu(), e)


def test_frexp_out_and_ldexp_roundtrip():
    x = torch.randn(4, 5) * 1e3
    with native():
        m, e = torch.empty(4, 5, device="tpu"), torch.empty(4, 5, dtype=torch.int32, device="tpu")
        torch.frexp(x.to("tpu"), out=(m, e))
    assert torch.equal(torch.ldexp(m.cpu(), e.cpu()), x)
