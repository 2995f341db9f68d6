"""Device-side bucketed storage (runtime.h DeviceStorage::padded_shape).

A bounded-dynamic executable's result keeps its bucket-sized buffer on the
device (the real elements at the front of each dim), and the next dynamic op
takes that buffer as it is: a chain of dynamic ops moves no data through the
host. Only the chain's first op pads its exact-size input (once per tensor).
Every other reader sees PyTorch's tensor exactly: strict-eager ops slice the
real elements out on the device; downloads, dtype views, resize, fused eager,
compiled graphs and jax_op compact the buffer first.
"""
from __future__ import annotations

import pytest
import torch

import torch_tpu
from torch_tpu import debug, dynamic

# Column counts no other test uses: a signature's sizes are observed on a
# miss of the exact-shape cache only, so each test keeps its own signatures.
COLS = 41


@pytest.fixture(autouse=True)
def auto_mode():
    dynamic.forget_sizes()
    with dynamic.dynamic_shapes("auto"):
        yield


def chain(x):
    y = torch.exp(x)
    z = y * 2.5
    w = torch.tanh(z) + y
    return w.sum(0), w


def warm(cols=COLS, sizes=(10, 11)):
    for n in sizes:  # the first size compiles static, the second the 16-bucket
        chain(torch.randn(n, cols).to("tpu"))


def padded_result(n, cols=COLS):
    """A result of a dynamic op (after warm-up), and its CPU twin."""
    x = torch.randn(n, cols)
    y = x.to("tpu") * 2.5  # mul.Tensor ran dynamic in warm(): y is padded (bit-exact vs CPU)
    assert torch_tpu._C._padded_shape(y) == [16, cols]
    return y, x * 2.5


def test_a_dynamic_chain_stays_on_the_device():
    warm()
    for n in (7, 9, 12):
        x = torch.randn(n, COLS)
        xt = x.to("tpu")
        debug.reset_stats()
        s, w = chain(xt)
        st = debug.stats()
        assert torch_tpu._C._padded_shape(w) == [16, COLS]
        assert torch_tpu._C._padded_shape(s) == []  # the reduced dim was the dynamic one
        assert st["compiles"] == 0 and st["dynamic_hits"] == 5, st
        # The first op pads xt through the host once; the other four ops
        # read their inputs' padded buffers directly.
        assert st["transfers_to_device"] == 1 and st["transfers_to_host"] == 1, st
        es, ew = chain(x)
        torch.testing.assert_close(s.cpu(), es)
        torch.testing.assert_close(w.cpu(), ew)


def test_storage_metadata_is_pytorchs():
    warm(44)
    y, _ = padded_result(7, 44)
    assert y.untyped_storage().nbytes() == 7 * 44 * 4
    assert y.shape == (7, 44) and y.stride() == (44, 1) and y.storage_offset() == 0


def test_exact_ops_read_the_real_elements():
    warm(45)
    y, e = padded_result(9, 45)
    torch.testing.assert_close(y[2:, 3].cpu(), e[2:, 3])          # a view
    torch.testing.assert_close(y.t().contiguous().cpu(), e.t())     # transposed read
    torch.testing.assert_close(torch.cumsum(y, 0).cpu(), torch.cumsum(e, 0))  # not a dynamic rule
    torch.testing.assert_close(y.clone().cpu(), e)
    assert y[3, 4].item() == pytest.approx(e[3, 4].item(), rel=1e-6)


def test_in_place_and_partial_writes():
    warm(46)
    y, e = padded_result(12, 46)
    y[1:3] = 0.5  # partial write into the padded storage
    e[1:3] = 0.5
    torch.testing.assert_close(y.cpu(), e)
    y2, e2 = padded_result(13, 46)
    padded = torch_tpu._C._padded_shape(y2)
    assert padded != []
    y2.add_(1)  # an exact in-place op keeps the storage's padded layout
    assert torch_tpu._C._padded_shape(y2) == padded
    assert y2.untyped_storage().nbytes() == 13 * 46 * 4
    torch.testing.assert_close(y2.cpu(), e2 + 1)
    z = torch.exp(y2)  # ... which the next dynamic op reads as it is
    torch.testing.assert_close(z.cpu(), torch.exp(e2 + 1), rtol=1e-5, atol=0)


def test_dtype_view_resize_and_copy():
    warm(47)
    y, e = padded_result(7, 47)
    torch.testing.assert_close(y.view(torch.int32).cpu(), e.view(torch.int32))
    y2, e2 = padded_result(8, 47)
    y2.resize_(3, 47)
    torch.testing.assert_close(y2.cpu(), e2[:3])
    y3, e3 = padded_result(9, 47)
    dst = torch.empty(9, 47, device="tpu")
    dst.copy_(y3)
    torch.testing.assert_close(dst.cpu(), e3)
    torch.testing.assert_close(y3.to(torch.float64).cpu(), e3.double())


def test_fused_eager_and_compiled_graphs_read_it():
    warm(48)
    y, e = padded_result(12, 48)
    with torch_tpu.fused():
        f = (y + 1) * y
    torch.testing.assert_close(f.cpu(), (e + 1) * e)
    y2, e2 = padded_result(13, 48)
    g = torch.compile(lambda t: torch.sin(t) * 2, backend="tpu")
    torch.testing.assert_close(g(y2).cpu(), torch.sin(e2) * 2)


def test_reductions_over_the_padded_dim_mask_the_padding():
    warm(cols=43)
    x = torch.rand(7, 43) + 0.5
    y = torch.exp(x.to("tpu")) * 2.5
    assert torch_tpu._C._padded_shape(y) == [16, 43]
    torch.testing.assert_close(y.prod(0).cpu(), (torch.exp(x) * 2.5).prod(0), rtol=1e-5, atol=0)
    torch.testing.assert_close(y.amin(0).cpu(), (torch.exp(x) * 2.5).amin(0))
    torch.testing.assert_close(torch.softmax(y, 0).cpu(), torch.softmax(torch.exp(x) * 2.5, 0))


def test_memory_counters_include_the_padding():
    warm(49)
    x = torch.randn(7, 49).to("tpu")
    base = torch.tpu.memory_allocated()
    y = x * 2.5  # 7 rows real, 16 in its buffer
    assert torch_tpu._C._padded_shape(y) == [16, 49]
    # x was padded (for y's op) and y is: each holds 16 rows of 49 floats.
    assert torch.tpu.memory_allocated() - base == (16 - 7) * 49 * 4 + 16 * 49 * 4
    del y
    assert torch.tpu.memory_allocated() - base == (16 - 7) * 49 * 4
    x.add_(1)  # an in-place write keeps x's padded buffer (no second copy)
    assert torch.tpu.memory_allocated() - base == (16 - 7) * 49 * 4
    del x
    assert torch.tpu.memory_allocated() == base - 7 * 49 * 4


def test_writing_a_walking_window_of_a_padded_storage_does_not_recompile():
    """`cache[:, t] = x` at each step t of a padded storage (zeros made by a
    dynamic fill): the window's position along the storage is a runtime
    start, not part of the key. It compiled 3 executables per step."""
    for n in (5, 6, 7):  # zero_ runs dynamic from the second: the next zeros are a padded storage
        torch.zeros(2, n, 4, device="tpu").cpu()
    cache, ref = torch.zeros(2, 8, 4, device="tpu"), torch.zeros(2, 8, 4)
    v = torch.arange(8.0).reshape(2, 4)
    v_tpu = v.to("tpu")
    compiles = []
    for t in range(8):
        for c, x in ((cache, v_tpu), (ref, v)):
            c[:, t] = x + t
            c[:, t].mul_(2)
            c[1, t, 1:3].copy_(x[0, :2])
        compiles.append(debug.stats()["compiles"])
    assert compiles[2:] == [compiles[1]] * 6, compiles  # t = 0, then t = 1 (a runtime start), then none
    assert torch.equal(cache.cpu(), ref)
