"""Views alias their base exactly as on the CPU; writes through any view are
seen through every alias; data_ptr / storage geometry match PyTorch's."""
from __future__ import annotations

from typing import Callable

import pytest
import torch

import torch_tpu


def _aliases(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every kind of view of a (6, 8) tensor."""
    flat = x.view(48)
    return {
        "view": x.view(8, 6),
        "reshape": x.reshape(2, 3, 8),
        "flat": flat,
        "as_strided": x.as_strided((3, 3), (9, 2), 5),
        "steps": x[1::2, ::3],
        "range_step": x[1:5:2],
        "select": x.select(1, 2),
        "index": x[3],
        "narrow": x.narrow(0, 1, 3),
        "t": x.t(),
        "permute": x.view(2, 3, 8).permute(2, 0, 1),
        "expand": x[0].expand(3, 8),
        "unsqueeze": x.unsqueeze(1),
        "squeeze": x.unsqueeze(0).squeeze(0),
        "unfold": flat.unfold(0, 5, 3),
        "diagonal": x.diagonal(),
        "diagonal1": x.diagonal(offset=2),
        "split": x.split(2)[1],
        "chunk": x.chunk(3, dim=1)[2],
        "unbind": x.unbind(0)[4],
        "movedim": x.view(2, 3, 8).movedim(0, 2),
    }


def _program(device: str) -> dict[str, torch.Tensor]:
    """Writes through views of every kind; returns the base and all aliases."""
    x = torch.arange(48, dtype=torch.float32).reshape(6, 8).to(device)
    al = _aliases(x)
    x[:, 1:3] = torch.full((6, 2), -1.0).to(device)
    x[2:4].copy_(torch.arange(16.0).reshape(2, 8).to(device) * 7)
    x.t().add_(1)
    x.index_put_((torch.tensor([0, 5]).to(device), torch.tensor([1, 7]).to(device)),
                 torch.tensor([100.0, 200.0]).to(device))
    x[::2] *= 2
    x.diagonal().fill_(-5)
    al["select"].sub_(3)
    al["unbind"].mul_(0.5)
    al["narrow"][:, -1] = 9.0
    al["flat"][40:44] = torch.tensor([1.0, 2.0, 3.0, 4.0]).to(device)
    al["permute"][0].zero_()
    al["as_strided"].add_(1000)
    x[x > 300] = 0.5  # boolean-mask index_put
    al["split"].clamp_(max=50)
    return {"x": x, **al}


def test_writes_through_views_match_cpu():
    want = _program("cpu")
    got = _program("tpu")
    for name in want:
        assert got[name].shape == want[name].shape, name
        assert got[name].stride() == want[name].stride(), name
        assert got[name].storage_offset() == want[name].storage_offset(), name
        assert torch.equal(got[name].cpu(), want[name]), name


@pytest.mark.parametrize("name", sorted(_aliases(torch.empty(6, 8)).keys()))
def test_view_geometry_and_storage_sharing(name):
    cpu = torch.arange(48.0).reshape(6, 8)
    tpu = cpu.to("tpu")
    a, b = _aliases(cpu)[name], _aliases(tpu)[name]
    assert (b.shape, b.stride(), b.storage_offset()) == (a.shape, a.stride(), a.storage_offset())
    assert b.untyped_storage().data_ptr() == tpu.untyped_storage().data_ptr()
    assert b.data_ptr() - tpu.data_ptr() == a.data_ptr() - cpu.data_ptr()
    assert b._is_view() == a._is_view()
    assert torch.equal(b.cpu(), a)


def test_data_ptr_arithmetic():
    x = torch.zeros(4, 5, device="tpu")
    y = torch.zeros(4, 5, device="tpu")
    assert x.data_ptr() != y.data_ptr()
    assert x.data_ptr() % 64 == 0
    assert x[1].data_ptr() - x.data_ptr() == 5 * 4
    assert x[2, 3].data_ptr() - x.data_ptr() == (2 * 5 + 3) * 4
    assert x[:, 2].data_ptr() - x.data_ptr() == 2 * 4
    h = torch.zeros(4, 5, dtype=torch.float16, device="tpu")
    assert h[3].data_ptr() - h.data_ptr() == 3 * 5 * 2
    # Storages never overlap.
    lo, hi = sorted([x, y], key=lambda t: t.data_ptr())
    assert hi.data_ptr() >= lo.data_ptr() + lo.untyped_storage().nbytes()
    assert x.untyped_storage().nbytes() == 80
    assert x[1:3].untyped_storage().nbytes() == 80
    assert torch.empty(3, 7, dtype=torch.int64, device="tpu").untyped_storage().nbytes() == 168


def test_resize_grow_keeps_prefix():
    cpu = torch.arange(6.0)
    tpu = cpu.to("tpu")
    cpu.resize_(3, 4)
    tpu.resize_(3, 4)
    assert tpu.shape == (3, 4) and tpu.stride() == (4, 1)
    assert tpu.untyped_storage().nbytes() == 48
    assert torch.equal(tpu.cpu().flatten()[:6], cpu.flatten()[:6])
    tpu[2] = 1.0
    assert torch.equal(tpu.cpu()[2], torch.ones(4))
    assert torch.equal(tpu.cpu().flatten()[:6], torch.arange(6.0))
    # Shrinking keeps the storage and the values.
    tpu.resize_(2)
    assert torch.equal(tpu.cpu(), torch.tensor([0.0, 1.0]))
    assert tpu.untyped_storage().nbytes() == 48
    # resize_ of an empty tensor, then writes.
    e = torch.empty(0, device="tpu")
    e.resize_(5).fill_(2.0)
    assert torch.equal(e.cpu(), torch.full((5,), 2.0))


def test_untyped_storage_resize():
    x = torch.arange(4.0, device="tpu")
    s = x.untyped_storage()
    s.resize_(32)
    assert s.nbytes() == 32
    y = torch.empty(0, device="tpu").set_(s, 0, (8,), (1,))
    assert torch.equal(y.cpu()[:4], torch.arange(4.0))


def test_set_():
    a = torch.arange(12.0, device="tpu")
    b = torch.empty(0, device="tpu")
    b.set_(a.untyped_storage(), 2, (2, 3), (3, 1))
    assert torch.equal(b.cpu(), torch.arange(12.0)[2:8].view(2, 3))
    assert b.data_ptr() - a.data_ptr() == 8
    b.add_(100)
    want = torch.arange(12.0)
    want[2:8] += 100
    assert torch.equal(a.cpu(), want)
    c = torch.empty(0, device="tpu").set_(a)
    c[0] = -1
    assert a[0].item() == -1
    d = torch.empty(0, device="tpu").set_(a.untyped_storage())
    assert torch.equal(d.cpu(), a.cpu())
    e = a.clone().set_()
    assert e.numel() == 0 and e.device.type == "tpu"


def test_dtype_view_reinterprets_bytes():
    c = torch.tensor([1.0, -2.0, 0.5])
    t = c.to("tpu")
    assert torch.equal(t.view(torch.int32).cpu(), c.view(torch.int32))
    assert torch.equal(t.view(torch.uint8).cpu(), c.view(torch.uint8))


def _walk(write: Callable[[torch.Tensor, int], None], steps: int = 8) -> list[int]:
    compiles = []
    for t in range(steps):
        write(t)
        compiles.append(torch_tpu.debug.stats()["compiles"])
    return compiles


def test_walking_a_view_along_a_buffer_does_not_recompile():
    # An exact storage: sizes earlier tests ran (zero_ at [2, n, 4] turned
    # dynamic) would make these zeros a padded storage, whose walk compiles
    # its first two steps (tests/dynamic/test_padded_storage.py).
    torch_tpu.dynamic.forget_sizes()
    cache = torch.zeros(2, 8, 4, device="tpu")
    ref = torch.zeros(2, 8, 4)
    v = torch.arange(8.0).reshape(2, 4)
    v_tpu = v.to("tpu")

    def write(t: int) -> None:
        cache[:, t] = v_tpu + t
        ref[:, t] = v + t
        cache[:, t].mul_(2)
        ref[:, t].mul_(2)
        cache[1, t, 1:3].copy_(v_tpu[0, :2])
        ref[1, t, 1:3].copy_(v[0, :2])

    compiles = _walk(write)
    assert compiles[1:] == [compiles[0]] * (len(compiles) - 1), compiles
    assert torch.equal(cache.cpu(), ref)
    # Reading along the buffer does not recompile either.
    before = torch_tpu.debug.stats()["compiles"]
    sums = [cache[:, t].sum().item() for t in range(8)]
    after_first = torch_tpu.debug.stats()["compiles"]
    sums += [cache[:, t].sum().item() for t in range(8)]
    assert torch_tpu.debug.stats()["compiles"] == after_first <= before + 1
    assert sums[:8] == [ref[:, t].sum().item() for t in range(8)]


def test_writing_a_slice_of_a_big_storage():
    # The sizes earlier tests ran (`upd * i` may have turned dynamic, its
    # result padded in one call and exact in another) must not decide the
    # compile count here.
    torch_tpu.dynamic.forget_sizes()
    n = 1 << 20
    big = torch.zeros(n, device="tpu")
    upd = torch.ones(16, device="tpu")
    big[0:16] = upd * 1  # warm up (compiles)
    # Copies taken before the in-place writes (whose storage buffer is donated)
    # must keep their values.
    snapshot = big.clone()
    copied = torch.empty(n, device="tpu")
    copied.copy_(big)
    alias = big.view(1024, 1024)
    torch_tpu.debug.reset_stats()
    for i in range(1, 5):
        big[i * 1000:i * 1000 + 16] = upd * i
    s = torch_tpu.debug.stats()
    assert s["compiles"] == 0
    # one multiply and one in-place slice write per step, nothing else
    assert s["executions"] == 8, s
    assert s["fallbacks"] == {}
    assert s["transfers_to_host"] == 0
    want = torch.zeros(n)
    want[0:16] = 1
    before = want.clone()
    for i in range(1, 5):
        want[i * 1000:i * 1000 + 16] = i
    assert torch.equal(big.cpu(), want)
    assert torch.equal(alias.cpu(), want.view(1024, 1024))
    assert torch.equal(snapshot.cpu(), before)
    assert torch.equal(copied.cpu(), before)
