"""cummax / cummin natively, equal to CPU: NaN propagation (a later NaN
takes the index), ties (the later index), integers, bool, 0-d, backward."""
import pytest
import torch
from no_fallback import native

import torch_tpu  # noqa: F401

NAN = float("nan")
INPUTS = {
    "nan_ties": torch.tensor([1.0, 3.0, 3.0, NAN, 2.0, NAN, 5.0]),
    "ints": torch.tensor([[2, 1, 2, 1, 7], [0, 0, -3, 5, 5]]),
    "bool": torch.tensor([True, False, True, False]),
    "0d": torch.tensor(3.0),
    "inf": torch.tensor([-float("inf"), -float("inf"), 1.0, float("inf"), float("inf")]),
    "random": torch.randn(6, 37),
    "bf16": torch.randn(5, 33).bfloat16(),
}


@pytest.mark.parametrize("fn", [torch.cummax, torch.cummin], ids=["cummax", "cummin"])
@pytest.mark.parametrize("name", list(INPUTS))
def test_cummax_cummin_like_cpu(fn, name):
    x = INPUTS[name]
    for dim in range(-max(x.dim(), 1), max(x.dim(), 1)):
        e = fn(x, dim)
        with native():
            a = fn(x.to("tpu"), dim)
        torch.testing.assert_close(a.values.cpu(), e.values, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(a.indices.cpu(), e.indices)


def test_cummax_out_and_backward():
    x = torch.randn(4, 10)
    with native():
        v, i = torch.empty(4, 10, device="tpu"), torch.empty(4, 10, dtype=torch.long, device="tpu")
        torch.cummin(x.to("tpu"), 1, out=(v, i))
    assert torch.equal(i.cpu(), torch.cummin(x, 1).indices)
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    g = torch.randn(4, 10)
    torch.cummax(xc, 1).values.backward(g)
    with native():
        torch.cummax(xt, 1).values.backward(g.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)
