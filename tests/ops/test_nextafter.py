"""nextafter natively, bit-exact with CPU in f32, bf16 (bf16 steps) and f64:
zeros of both signs, subnormals, extremes, infinities, NaN, broadcasting, out=/in-place."""
import pytest
import torch
from no_fallback import native

import torch_tpu  # noqa: F401

V = [0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 1e-40, 3.4028235e38, -3.4028235e38,
     float("inf"), -float("inf"), float("nan"), 2.5, 1.17549435e-38]
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}


@pytest.mark.parametrize("dtype", list(BITS))
def test_nextafter_bit_exact(dtype):
    torch.manual_seed(0)
    x = torch.cat([torch.tensor(V).repeat_interleave(len(V)), torch.randn(200)]).to(dtype)
    y = torch.cat([torch.tensor(V).repeat(len(V)), torch.randn(200)]).to(dtype)
    e = torch.nextafter(x, y)
    with native():
        a = torch.nextafter(x.to("tpu"), y.to("tpu")).cpu()
    same = (a.view(BITS[dtype]) == e.view(BITS[dtype])) | (a.isnan() & e.isnan())
    assert bool(same.all()), (x[~same], y[~same], a[~same], e[~same])


def test_nextafter_broadcast_out_inplace():
    x, y = torch.randn(3, 4), torch.tensor([float("inf")])
    with native():
        out = torch.empty(3, 4, device="tpu")
        torch.nextafter(x.to("tpu"), y.to("tpu"), out=out)
        z = x.to("tpu")
        z.nextafter_(torch.zeros(4, device="tpu"))
    assert torch.equal(out.cpu(), torch.nextafter(x, y))
    assert torch.equal(z.cpu(), torch.nextafter(x, torch.zeros(4)))
