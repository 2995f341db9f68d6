"""index_reduce (csrc/lowering/scatter_reduce.cpp) and max_unpool2d/3d
(csrc/lowering/max_unpool.cpp): natively, equal to CPU."""
import pytest
import torch
import torch.nn.functional as F

from no_fallback import native


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_reduce(reduce, include_self, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 3, generator=g) * 4).to(dtype)
    src = (torch.randn(3, 6, generator=g) * 4).to(dtype)
    index = torch.tensor([0, 4, 4, 3, 2, 0])
    with native():
        got = x.T.to("tpu").index_reduce(1, index.to("tpu"), src.to("tpu"), reduce,
                                         include_self=include_self).cpu()
    want = x.T.index_reduce(1, index, src, reduce, include_self=include_self)
    torch.testing.assert_close(got, want)


def test_index_reduce_0d_and_bad_index():
    x, s = torch.tensor(2.0), torch.tensor(5.0)
    with native():
        got = x.to("tpu").index_reduce(0, torch.tensor([0], device="tpu"), s.to("tpu"), "amax").cpu()
    torch.testing.assert_close(got, x.index_reduce(0, torch.tensor([0]), s, "amax"))
    with pytest.raises(IndexError, match="out of range"):
        torch.zeros(3, device="tpu").index_reduce(0, torch.tensor([3], device="tpu"),
                                                  torch.ones(1, device="tpu"), "prod").cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_unpool_round_trip(dtype):
    x = torch.randn(2, 3, 8, 6).to(dtype)
    y, idx = F.max_pool2d(x, 2, return_indices=True)
    with native():
        got = F.max_unpool2d(y.to("tpu"), idx.to("tpu"), 2).cpu()
        got_sized = F.max_unpool2d(y.to("tpu"), idx.to("tpu"), 2, output_size=(9, 7)).cpu()
    torch.testing.assert_close(got, F.max_unpool2d(y, idx, 2))
    torch.testing.assert_close(got_sized, F.max_unpool2d(y, idx, 2, output_size=(9, 7)))
    x3 = torch.randn(3, 4, 4, 6).to(dtype)  # unbatched 3-d
    y3, idx3 = F.max_pool3d(x3, 2, return_indices=True)
    with native():
        got3 = F.max_unpool3d(y3.to("tpu"), idx3.to("tpu"), 2).cpu()
    torch.testing.assert_close(got3, F.max_unpool3d(y3, idx3, 2))
    x1 = torch.randn(2, 3, 10).to(dtype)
    y1, idx1 = F.max_pool1d(x1, 2, return_indices=True)
    with native():
        got1 = F.max_unpool1d(y1.to("tpu"), idx1.to("tpu"), 2).cpu()
    torch.testing.assert_close(got1, F.max_unpool1d(y1, idx1, 2))


def test_max_unpool_invalid_index_raises():
    y = torch.ones(1, 1, 2, 2, device="tpu")
    idx = torch.tensor([[[[0, 1], [2, 16]]]], device="tpu")
    with pytest.raises(IndexError, match="out of range"):
        F.max_unpool2d(y, idx, 2).cpu()
