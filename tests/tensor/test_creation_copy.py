"""Factories, host <-> device copies, printing, item(), save/load, dtypes."""
from __future__ import annotations

import pytest
import torch

TPU = torch.device("tpu", 0)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]


def _sample(dtype: torch.dtype) -> torch.Tensor:
    """Values that exercise the dtype's range (exactly representable)."""
    if dtype == torch.bool:
        return torch.tensor([[True, False, True], [False, False, True]])
    if dtype.is_floating_point:
        x = torch.tensor([[0.0, -1.5, 3.25], [1e-3, -7.0, 100.0]])
        if dtype == torch.float64:
            return x.double() / 3
        return x.to(dtype)
    info = torch.iinfo(dtype)
    return torch.tensor([[0, 1, info.max], [info.min, 7, info.max - 3]]).to(dtype)


# ---------------------------------------------------------------- factories

def test_empty_and_empty_strided():
    x = torch.empty(3, 4, device="tpu")
    assert x.device == TPU and x.shape == (3, 4) and x.dtype == torch.float32
    assert x.stride() == (4, 1)
    y = torch.empty_strided((2, 3), (1, 2), device="tpu", dtype=torch.int32)
    assert y.shape == (2, 3) and y.stride() == (1, 2) and y.dtype == torch.int32
    assert y.untyped_storage().nbytes() == 6 * 4
    y.copy_(torch.arange(6, dtype=torch.int32).reshape(2, 3))
    assert torch.equal(y.cpu(), torch.arange(6, dtype=torch.int32).reshape(2, 3))
    z = torch.empty(0, 5, device="tpu")
    assert z.numel() == 0 and z.cpu().shape == (0, 5)
    cl = torch.empty(2, 3, 4, 5, device="tpu", memory_format=torch.channels_last)
    assert cl.stride() == torch.empty(2, 3, 4, 5, memory_format=torch.channels_last).stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_zeros_ones_full(dtype):
    assert torch.equal(torch.zeros(2, 3, device="tpu", dtype=dtype).cpu(), torch.zeros(2, 3, dtype=dtype))
    assert torch.equal(torch.ones(4, device="tpu", dtype=dtype).cpu(), torch.ones(4, dtype=dtype))
    fill = True if dtype == torch.bool else 5
    assert torch.equal(torch.full((3, 2), fill, device="tpu", dtype=dtype).cpu(),
                       torch.full((3, 2), fill, dtype=dtype))
    x = torch.empty(5, device="tpu", dtype=dtype)
    assert torch.equal(torch.zeros_like(x).cpu(), torch.zeros(5, dtype=dtype))
    assert torch.equal(torch.ones_like(x).cpu(), torch.ones(5, dtype=dtype))


@pytest.mark.parametrize("make, want", [
    (lambda n: torch.zeros(n, device="tpu"), lambda n: torch.zeros(n)),
    (lambda n: torch.full((n,), 2.5, device="tpu"), lambda n: torch.full((n,), 2.5)),
    (lambda n: torch.empty(n, device="tpu").copy_(torch.arange(n, device="tpu").float()),
     lambda n: torch.arange(n).float()),
    (lambda n: torch.empty(n, device="tpu").uniform_(), None)], ids=["zeros", "full", "copy_", "uniform_"])
def test_fills_of_fresh_storages_compile_no_zeros_per_size(make, want):
    # A fresh storage that its first op overwrites whole gets a buffer with
    # unspecified elements: before, one past 64 KiB was zero-filled first, a
    # zeros module compiled for each size seen twice (1 compile per new
    # length of a training step's torch.zeros).
    from torch_tpu import debug
    for n in (70_001, 90_017, 110_003):
        make(n)  # first sight of the size
        debug.reset_stats()
        got = make(n).cpu()  # second sight
        assert debug.stats()["compiles"] == 0, (n, debug.stats()["compiles_by_op"])
        assert got.shape == (n,) and torch.isfinite(got).all()
        if want is not None:
            assert torch.equal(got, want(n))
        else:
            assert 0 <= got.min() and got.max() < 1


def test_fresh_storages_read_before_written_still_read_zeros():
    # Only whole overwrites skip the zeros: a storage read before it is
    # written, or written through a window, keeps zeros elsewhere.
    n = 80_000
    assert torch.empty(n, device="tpu").abs().sum().item() == 0
    x = torch.empty(n, device="tpu")
    x[10:].fill_(1.0)
    assert x[:10].abs().sum().item() == 0 and x.sum().item() == n - 10
    y = torch.empty(2, n, device="tpu")
    y[0].zero_()
    assert y.abs().sum().item() == 0


def test_full_infers_dtype():
    assert torch.full((2,), 2.5, device="tpu").dtype == torch.float32
    assert torch.full((2,), 3, device="tpu").dtype == torch.int64
    assert torch.full((2,), True, device="tpu").dtype == torch.bool
    assert torch.equal(torch.full((2, 2), -1.25, device="tpu").cpu(), torch.full((2, 2), -1.25))


@pytest.mark.parametrize("args,kwargs", [
    ((10,), {}),
    ((2, 11, 3), {}),
    ((0.0, 1.0, 0.1), {}),
    ((-5, 5), {"dtype": torch.float32}),
    ((10, 0, -3), {}),
    ((0, 8), {"dtype": torch.int32}),
])
def test_arange(args, kwargs):
    got = torch.arange(*args, device="tpu", **kwargs)
    want = torch.arange(*args, **kwargs)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("start,end,steps", [(0, 1, 7), (-3.5, 2.0, 50), (5, -5, 11), (1, 1, 1), (0, 1, 0)])
def test_linspace(start, end, steps):
    got = torch.linspace(start, end, steps, device="tpu").cpu()
    torch.testing.assert_close(got, torch.linspace(start, end, steps), rtol=1e-6, atol=1e-6)


def test_eye():
    assert torch.equal(torch.eye(4, device="tpu").cpu(), torch.eye(4))
    assert torch.equal(torch.eye(3, 5, device="tpu").cpu(), torch.eye(3, 5))
    assert torch.equal(torch.eye(5, 2, dtype=torch.int64, device="tpu").cpu(),
                       torch.eye(5, 2, dtype=torch.int64))


def test_rand_randn_randint():
    r = torch.rand(100, 3, device="tpu")
    assert r.shape == (100, 3) and r.dtype == torch.float32 and r.device == TPU
    rc = r.cpu()
    assert rc.min() >= 0 and rc.max() < 1 and rc.unique().numel() > 250
    rb = torch.rand(10, device="tpu", dtype=torch.bfloat16)
    assert rb.dtype == torch.bfloat16
    n = torch.randn(4, 5, 6, device="tpu", dtype=torch.float64)
    assert n.shape == (4, 5, 6) and n.dtype == torch.float64
    assert n.cpu().std() > 0.5
    i = torch.randint(-3, 9, (1000,), device="tpu")
    assert i.dtype == torch.int64
    ic = i.cpu()
    assert ic.min() >= -3 and ic.max() < 9
    assert set(ic.tolist()) == set(range(-3, 9))
    i8 = torch.randint(0, 5, (3, 3), device="tpu", dtype=torch.int8)
    assert i8.dtype == torch.int8 and i8.cpu().max() < 5
    like = torch.randn_like(torch.empty(2, 7, device="tpu"))
    assert like.shape == (2, 7) and like.device == TPU


# ---------------------------------------------------------------- copies

def test_to_and_cpu_round_trip():
    x = torch.randn(5, 7)
    t = x.to("tpu")
    assert t.device == TPU and t.is_contiguous()
    assert torch.equal(t.cpu(), x)
    assert t.to("tpu") is t  # no-op
    assert torch.equal(x.to(TPU, dtype=torch.float64).cpu(), x.double())
    assert torch.equal(t.to(torch.float16).cpu(), x.half())
    # Non-contiguous sources and destinations.
    nc = x.t()
    assert torch.equal(nc.to("tpu").cpu(), nc)
    assert torch.equal(t.t().cpu(), nc)
    assert torch.equal(t[1::2, ::3].cpu(), x[1::2, ::3])
    host = torch.zeros(7, 5)
    host.copy_(t.t())
    assert torch.equal(host, nc)
    dst = torch.zeros(4, 10, device="tpu")
    dst[:, ::2].copy_(torch.ones(4, 5))
    want = torch.zeros(4, 10)
    want[:, ::2] = 1
    assert torch.equal(dst.cpu(), want)
    # Broadcasting copy from the host.
    b = torch.zeros(3, 4, device="tpu")
    b.copy_(torch.arange(4.0))
    assert torch.equal(b.cpu(), torch.arange(4.0).expand(3, 4))


def test_non_blocking_copies():
    x = torch.randn(64, 64)
    t = x.to("tpu", non_blocking=True)
    y = (t * 2).to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(y, x * 2)
    pinned = x.pin_memory()
    assert torch.equal(pinned.to("tpu", non_blocking=True).cpu(), x)
    # Overwriting the host source right after a non-blocking upload is safe.
    src = torch.ones(1000)
    dev = src.to("tpu", non_blocking=True)
    src.fill_(5)
    assert torch.equal(dev.cpu(), torch.ones(1000))


def test_device_to_device_copy():
    x = torch.randn(6, 4)
    a = x.to("tpu")
    b = torch.empty(6, 4, device="tpu")
    b.copy_(a)
    a.add_(1)  # b is independent of a
    assert torch.equal(b.cpu(), x)
    assert torch.equal(a.cpu(), x + 1)
    c = a.clone()
    assert c.data_ptr() != a.data_ptr()
    assert torch.equal(c.cpu(), x + 1)
    d = torch.empty(6, 4, device="tpu", dtype=torch.float64)
    d.copy_(a)
    assert torch.equal(d.cpu(), (x + 1).double())
    e = torch.empty(4, 6, device="tpu")
    e.copy_(a.t())
    assert torch.equal(e.cpu(), (x + 1).t())


def test_repr_shows_device():
    x = torch.arange(6, device="tpu").reshape(2, 3)
    r = repr(x)
    assert "device='tpu:0'" in r and "[3, 4, 5]" in r
    f = torch.tensor([1.5, -2.0, 0.25]).to("tpu")
    rf = repr(f)
    assert "device='tpu:0'" in rf and "1.5000" in rf and "-2.0000" in rf
    assert str(torch.tensor([True, False]).to("tpu")).startswith("tensor([ True, False]")
    # Same text as on the CPU, plus the device (summarized and scientific too).
    for c in (torch.arange(5000.0), torch.tensor([1e-8, 1e8, float("inf"), float("nan")]),
              torch.randn(4, 3)):
        assert repr(c.to("tpu")) == repr(c)[:-1] + ", device='tpu:0')"


def test_item():
    assert torch.tensor(3.5).to("tpu").item() == 3.5
    assert torch.tensor([[7]]).to("tpu").item() == 7
    assert torch.tensor(True).to("tpu").item() is True
    x = torch.arange(10.0, device="tpu")
    assert x[3].item() == 3.0
    assert x.sum().item() == 45.0
    assert x.tolist() == list(map(float, range(10)))
    with pytest.raises(RuntimeError):
        x.item()


def test_save_load_round_trip(tmp_path):
    x = torch.randn(3, 4).to("tpu")
    i = torch.arange(5, dtype=torch.int32).to("tpu")
    view = x[1:, ::2]
    path = tmp_path / "t.pt"
    torch.save({"x": x, "i": i, "view": view}, path)
    on_cpu = torch.load(path, map_location="cpu")
    assert torch.equal(on_cpu["x"], x.cpu())
    loaded = torch.load(path, map_location="tpu")
    assert loaded["x"].device == TPU and loaded["i"].device == TPU
    assert torch.equal(loaded["x"].cpu(), x.cpu())
    assert torch.equal(loaded["i"].cpu(), i.cpu())
    assert torch.equal(loaded["view"].cpu(), view.cpu())
    # The view still shares storage with x after loading.
    assert loaded["view"].untyped_storage().data_ptr() == loaded["x"].untyped_storage().data_ptr()
    loaded["x"][1, 0] = 100.0
    assert loaded["view"][0, 0].item() == 100.0
    # A CPU checkpoint loaded straight onto tpu.
    cpu_path = tmp_path / "c.pt"
    torch.save(torch.nn.Linear(3, 2).state_dict(), cpu_path)
    sd = torch.load(cpu_path, map_location="tpu")
    assert all(v.device == TPU for v in sd.values())


# ---------------------------------------------------------------- dtypes

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_round_trip_and_add(dtype):
    c = _sample(dtype)
    t = c.to("tpu")
    assert t.dtype == dtype
    back = t.cpu()
    assert back.dtype == dtype and torch.equal(back, c)
    if dtype == torch.bool:
        want = c + c  # logical or
    elif dtype.is_floating_point:
        want = c + c
    else:
        want = c // 2 + c // 3  # no overflow
        t = t // 2
        got = (t + c.to("tpu") // 3).cpu()
        assert got.dtype == dtype and torch.equal(got, want)
        return
    got = (t + t).cpu()
    assert got.dtype == want.dtype and torch.equal(got, want)
    got2 = (t + c.to("tpu")).cpu()
    assert torch.equal(got2, want)
