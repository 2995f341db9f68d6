"""nanmedian natively, against CPU: NaN ignored, lower median, all-NaN slices."""
import pytest
import torch
from no_fallback import native

import torch_tpu  # noqa: F401

NAN = float("nan")


def _input(dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 7).to(dtype)
    x[0, 1] = x[2, 0] = x[2, 3] = x[4, 6] = NAN
    x[3] = NAN  # a slice with nothing but NaN
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim,keepdim", [(1, False), (0, True), (-1, True)])
def test_nanmedian_dim(dtype, dim, keepdim):
    x = _input(dtype)
    e = torch.nanmedian(x, dim, keepdim=keepdim)
    with native():
        a = torch.nanmedian(x.to("tpu"), dim, keepdim=keepdim)
    torch.testing.assert_close(a.values.cpu(), e.values, equal_nan=True, rtol=0, atol=0)
    # indices: equal where the slice has a number (ties are CPU's nth_element's choice)
    has_number = ~x.isnan().all(dim, keepdim=keepdim)
    assert torch.equal(a.indices.cpu()[has_number], e.indices[has_number])


def test_nanmedian_all_out_and_empty():
    x = _input(torch.float32)
    with native():
        assert torch.nanmedian(x.to("tpu")).item() == torch.nanmedian(x).item()
        v, i = torch.empty(5, device="tpu"), torch.empty(5, dtype=torch.long, device="tpu")
        torch.nanmedian(x.to("tpu"), 1, out=(v, i))
        assert torch.isnan(torch.nanmedian(torch.full((3,), NAN, device="tpu"))).item()
        assert torch.isnan(torch.nanmedian(torch.empty(0, device="tpu"))).item()
    torch.testing.assert_close(v.cpu(), torch.nanmedian(x, 1).values, equal_nan=True)
    with pytest.raises(IndexError, match="non-zero size"):
        torch.nanmedian(torch.empty(2, 0, device="tpu"), 1)
