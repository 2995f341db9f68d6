"""index_fill (and index_copy's backward, which uses it) natively, vs CPU."""
import pytest
import torch

import torch_tpu


def _fallbacks():
    return dict(torch_tpu.debug.stats()["fallbacks"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_fill_matches_cpu(dtype, dim):
    x = (torch.randn(4, 5, 3) * 10).to(dtype)
    index = torch.tensor([2, 0, -1, 2])
    before = _fallbacks()
    got = x.to("tpu").index_fill(dim, index.to("tpu"), 7).cpu()
    assert _fallbacks() == before
    torch.testing.assert_close(got, x.index_fill(dim, index, 7))
    value = torch.tensor(-3, dtype=dtype)
    y = x.clone()
    yt = y.to("tpu")
    yt.index_fill_(dim, index.to("tpu"), value.to("tpu"))
    torch.testing.assert_close(yt.cpu(), y.index_fill_(dim, index, value))


def test_index_fill_edge_cases():
    x = torch.randn(3, 4)
    empty = torch.tensor([], dtype=torch.long)
    torch.testing.assert_close(x.to("tpu").index_fill(1, empty.to("tpu"), 1.0).cpu(), x)
    s = torch.tensor(2.5)
    torch.testing.assert_close(s.to("tpu").index_fill(0, torch.tensor([0], device="tpu"), 1.0).cpu(),
                               s.index_fill(0, torch.tensor([0]), 1.0))
    with pytest.raises(IndexError, match="out of range"):
        x.to("tpu").index_fill(1, torch.tensor([4], device="tpu"), 1.0).cpu()


def test_index_copy_backward_is_native():
    x = torch.randn(4, 5, requires_grad=True)
    src = torch.randn(2, 5, requires_grad=True)
    index = torch.tensor([3, 1])
    xt = x.detach().to("tpu").requires_grad_()
    st = src.detach().to("tpu").requires_grad_()
    torch.index_copy(x, 0, index, src).pow(2).sum().backward()
    before = _fallbacks()
    torch.index_copy(xt, 0, index.to("tpu"), st).pow(2).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad)
    torch.testing.assert_close(st.grad.cpu(), src.grad)
    assert _fallbacks() == before
