"""torch.compile(backend="tpu"): mutated graph inputs update in place by donation.

AOTAutograd keeps in-place updates of graph inputs (buffers, KV caches) in the
graph as a ``copy_(input, new_value)`` epilogue; the backend turns each into a
module result aliased to the input's parameter, donates the input's buffer and
rebinds the storage: no copy op runs, the tensor object and its storage (and
every view of it) see the new value. Each test compares with the same code run
eagerly on CPU and counts executions, copies, compiles and donations.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torch_tpu
import torch_tpu.compile as tpu_compile

COPY_OPS = ("copy_", "copy_convert", "_copy_from", "_to_copy", "clone")


def _compiles() -> int:
    s = torch_tpu.debug.stats()
    return s["compiles"] + s.get("disk_hits", 0)


def _copies(stats: dict) -> dict:
    return {k: v for k, v in stats["native_ops"].items() if any(c in k for c in COPY_OPS)}


def _storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_buffer_add_is_donated_not_copied():
    def f(buf, x):
        buf.add_(x)
        return buf * 2

    torch.manual_seed(0)
    x_cpu = torch.randn(4, 8)
    buf_cpu = torch.zeros(4, 8)
    buf, x = buf_cpu.to("tpu"), x_cpu.to("tpu")
    alias = buf[1]  # a view taken before: must see the updates
    ptr, storage = buf.data_ptr(), _storage_id(buf)
    cf = torch.compile(f, backend="tpu")
    cf(buf, x)  # compile
    f(buf_cpu, x_cpu)
    torch.tpu.synchronize()
    torch_tpu.debug.reset_stats()
    tpu_compile.reset_stats()
    for _ in range(3):
        out = cf(buf, x)
        ref = f(buf_cpu, x_cpu)
    torch.tpu.synchronize()
    s = torch_tpu.debug.stats()
    assert s["executions"] == 3  # one module per call, nothing else
    assert _copies(s) == {}
    assert s["fallbacks"] == {}
    assert s["compiles"] == 0
    st = tpu_compile.stats()
    assert st["inputs_donated"] == 3
    assert st["inputs_copied_back"] == 0 and st["inputs_rebound"] == 0
    assert buf.data_ptr() == ptr and _storage_id(buf) == storage
    torch.testing.assert_close(buf.cpu(), buf_cpu)
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(alias.cpu(), buf_cpu[1])


class KVCache(nn.Module):
    """A decoder step: writes k/v at `pos` into caches, attends over them."""

    def __init__(self, b=2, h=2, s=16, d=8, slice_assign=False):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(b, h, s, d))
        self.register_buffer("v_cache", torch.zeros(b, h, s, d))
        self.slice_assign = slice_assign

    def forward(self, q, k, v, pos):
        if self.slice_assign:
            self.k_cache[:, :, pos:pos + 1] = k
            self.v_cache[:, :, pos:pos + 1] = v
        else:
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v)
        scores = q @ self.k_cache.transpose(-1, -2)
        return scores.softmax(-1) @ self.v_cache


@pytest.mark.parametrize("slice_assign", [False, True], ids=["index_copy_", "slice_assign"])
def test_kv_cache_updates_in_place(slice_assign):
    torch.manual_seed(0)
    cpu = KVCache(slice_assign=slice_assign)
    dev = KVCache(slice_assign=slice_assign).to("tpu")
    ptrs = [dev.k_cache.data_ptr(), dev.v_cache.data_ptr()]
    k_view = dev.k_cache[:, :, 0]
    step = torch.compile(dev, backend="tpu", dynamic=False)
    donated = 0
    for t in range(3):
        q, k, v = (torch.randn(2, 2, 1, 8) for _ in range(3))
        # index_copy_ takes a position tensor; slice assignment a Python int
        # (one graph per position, as Dynamo specializes ints).
        pos = torch.tensor([t]) if not slice_assign else t
        pos_dev = pos.to("tpu") if isinstance(pos, torch.Tensor) else pos
        ref = cpu(q, k, v, pos)
        torch_tpu.debug.reset_stats()
        out = step(q.to("tpu"), k.to("tpu"), v.to("tpu"), pos_dev)
        torch.tpu.synchronize()
        s = torch_tpu.debug.stats()
        assert _copies(s) == {}, s["native_ops"]
        assert s["fallbacks"] == {}
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
        donated += 2
        assert tpu_compile.stats()["inputs_donated"] == donated
    assert [dev.k_cache.data_ptr(), dev.v_cache.data_ptr()] == ptrs
    torch.testing.assert_close(dev.k_cache.cpu(), cpu.k_cache)
    torch.testing.assert_close(dev.v_cache.cpu(), cpu.v_cache)
    torch.testing.assert_close(k_view.cpu(), cpu.k_cache[:, :, 0])
    st = tpu_compile.stats()
    assert st["fallback_graphs"] == 0
    assert st["inputs_copied_back"] == 0
    # index_copy_ with a position tensor: one graph for all steps.
    assert st["native_graphs"] == (1 if not slice_assign else 3)


def test_one_compile_per_shape():
    def f(buf, x):
        buf.mul_(0.5).add_(x)
        return buf.sum()

    cf = torch.compile(f, backend="tpu", dynamic=False)
    torch_tpu.debug.clear_cache()  # count builds even if the modules were seen before
    n0 = _compiles()
    for shape in [(4, 8), (4, 8), (6, 3), (6, 3), (4, 8)]:
        buf_cpu, x_cpu = torch.ones(shape), torch.randn(shape)
        buf = buf_cpu.to("tpu")
        ptr = buf.data_ptr()
        out = cf(buf, x_cpu.to("tpu"))
        ref = f(buf_cpu, x_cpu)
        torch.testing.assert_close(out.cpu(), ref)
        torch.testing.assert_close(buf.cpu(), buf_cpu)
        assert buf.data_ptr() == ptr
    # Two shapes: one graph module each, compiled once (uploads and
    # downloads compile nothing).
    st = tpu_compile.stats()
    assert st["native_graphs"] == 2 and st["fallback_graphs"] == 0
    assert st["inputs_donated"] == 5
    assert _compiles() - n0 == 2


def test_non_dense_view_input_is_written_back():
    def f(buf, x):
        buf.add_(x)
        return buf + 1

    base_cpu = torch.arange(32.0).reshape(4, 8)
    base = base_cpu.to("tpu")
    view, view_cpu = base[:, ::2], base_cpu[:, ::2]
    x_cpu = torch.randn(4, 4)
    out = torch.compile(f, backend="tpu")(view, x_cpu.to("tpu"))
    ref = f(view_cpu, x_cpu)
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(base.cpu(), base_cpu)  # odd columns untouched
    st = tpu_compile.stats()
    assert st["inputs_copied_back"] == 1 and st["inputs_donated"] == 0


class RunningMean(nn.Module):
    """A layer with a buffer updated in forward (like BatchNorm's running stats)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("running", torch.zeros(8))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            self.running.mul_(0.9).add_(y.mean(0), alpha=0.1)
            self.steps.add_(1)
        return torch.tanh(y)


def test_training_step_with_buffer_mutation():
    torch.manual_seed(0)
    cpu = RunningMean()
    dev = RunningMean().to("tpu")
    dev.load_state_dict(cpu.state_dict())
    ptr = dev.running.data_ptr()
    step = torch.compile(dev, backend="tpu")
    for _ in range(2):
        x = torch.randn(5, 8)
        cpu(x).pow(2).sum().backward()
        step(x.to("tpu")).pow(2).sum().backward()
    torch.testing.assert_close(dev.running.cpu(), cpu.running, rtol=1e-4, atol=1e-5)
    assert int(dev.steps.cpu()) == 2
    torch.testing.assert_close(dev.lin.weight.grad.cpu(), cpu.lin.weight.grad, rtol=1e-4, atol=1e-5)
    assert dev.running.data_ptr() == ptr
    st = tpu_compile.stats()
    assert st["fallback_graphs"] == 0
    assert st["inputs_donated"] == 2 * 2  # running and steps, two steps


def test_aliased_inputs_one_mutated():
    """Two views of one storage, one mutated: AOTAutograd passes their base
    once (as_strided_scatter writes the view into it), updated in place."""

    def f(a, b):
        a.add_(1)
        return b * 2

    base = torch.zeros(8, device="tpu")
    out = torch.compile(f, backend="tpu")(base, base.view(2, 4))
    ref_base = torch.zeros(8)
    ref = f(ref_base, ref_base.view(2, 4))
    torch.testing.assert_close(base.cpu(), ref_base)
    torch.testing.assert_close(out.cpu(), ref)
    st = tpu_compile.stats()
    assert st["fallback_graphs"] == 0
    assert st["inputs_donated"] == 1
