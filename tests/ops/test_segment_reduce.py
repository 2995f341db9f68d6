"""segment_reduce (lengths and offsets) and its backward natively, vs CPU.

Every sample op_db has for the op (5 reductions x 2 initial values x 9
layouts, including empty segments and lengths that do not cover the axis
with unsafe=True), plus NaNs, ties and zeros for the backward's special
cases.
"""
from __future__ import annotations

import pytest
import torch

import torch_tpu


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def _samples(mode: str):
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if o.name == "_segment_reduce" and o.variant_test_name == mode)
    return list(op.sample_inputs("cpu", torch.float32, requires_grad=True))


def _on_tpu(kwargs: dict) -> dict:
    return {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


@pytest.mark.parametrize("mode", ["lengths", "offsets"])
def test_op_db_samples_values_and_gradients(mode: str) -> None:
    before = _fallbacks()
    for s in _samples(mode):
        x = s.input.detach()
        xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
        want = torch.segment_reduce(xc, *s.args, **s.kwargs)
        got = torch.segment_reduce(xt, *s.args, **_on_tpu(s.kwargs))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5, equal_nan=True,
                                   msg=lambda m: f"{s.args} {s.kwargs}: {m}")
        w = torch.randn(want.shape)
        (want * w).nan_to_num().sum().backward()
        (got * w.to("tpu")).nan_to_num().sum().backward()
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"backward {s.args} {s.kwargs}: {m}")
    assert _fallbacks() == before


@pytest.mark.parametrize("reduce", ["max", "min", "prod", "mean", "sum"])
def test_nan_ties_and_zeros(reduce: str) -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0, 0.0, 4.0, float("nan"), 2.0],
                      [0.0, 0.0, 5.0, -1.0, -1.0, 2.0, 2.0, 7.0]])
    lengths = torch.tensor([[3, 0, 3, 2], [2, 3, 0, 3]])
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    kw = dict(lengths=lengths, axis=1)
    want = torch.segment_reduce(xc, reduce, **kw)
    got = torch.segment_reduce(xt, reduce, **_on_tpu(kw))
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    g = torch.tensor([[1.0, -2.0, 0.5, 3.0], [-1.0, 2.0, 1.0, 0.25]])
    want.backward(g)
    got.backward(g.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, equal_nan=True)


def test_lengths_that_do_not_cover_the_axis_raise() -> None:
    x = torch.randn(5, device="tpu")
    with pytest.raises(IndexError, match="sum to data.size"):
        torch.segment_reduce(x, "sum", lengths=torch.tensor([1, 2], device="tpu")).cpu()
