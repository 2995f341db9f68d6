"""Warm calls on bounded-dynamic executables (csrc/aten/call_fast.cpp).

A call at sizes inside a bucket that ran before, on storages in the same
padded layouts, is launched by the hit path: no planning, no signature or
key text, the same executable with the same runtime sizes. Every variation
here (new values, new scalars, other windows of one storage, in-place
updates, a mode switch, a hint) must still give PyTorch's CPU result, and
the repeated calls must neither compile nor go through the host.

Also here: a static window of a padded storage whose start moves with its
size (the last token of a growing batch of sequences, `ids[:, -1:]`) takes
its start at run time, so new lengths compile nothing and the storage is
never padded again through the host.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import debug, dynamic


@pytest.fixture(autouse=True)
def auto_mode():
    dynamic.forget_sizes()
    with dynamic.dynamic_shapes("auto"):
        yield


def block(x, w, b):
    """A chain of dynamic ops (linear on padded rows, gelu, softmax, a masked
    reduction): padding read as elements anywhere would change the sums."""
    h = F.gelu(F.linear(x, w, b))
    return torch.softmax(h * 1.5, -1).sum(1)


def test_a_warm_size_is_launched_by_the_hit_path_with_cpu_results():
    w, b = torch.randn(24, 19) / 4, torch.randn(24)
    dw, db = w.to("tpu"), b.to("tpu")
    for n in (33, 34):  # static, then the 36-bucket
        block(torch.randn(3, n, 19).to("tpu"), dw, db).cpu()
    x = torch.randn(3, 35, 19)
    dx = x.to("tpu")
    block(dx, dw, db).cpu()  # the full path; dx is padded through the host (not remembered)
    block(dx, dw, db).cpu()  # the full path, each launch remembered
    debug.reset_stats()
    for _ in range(3):
        got = block(dx, dw, db)
        torch.testing.assert_close(got.cpu(), block(x, w, b), atol=1e-5, rtol=1e-5)
    s = debug.stats()
    assert s["compiles"] == 0, s["compiles_by_op"]
    assert s["dynamic_hits"] > 0 and s["dynamic_hit_path_hits"] == s["dynamic_hits"], s
    # The results' padded layouts are the full path's: nbytes and views as PyTorch's.
    assert got.untyped_storage().nbytes() == 3 * 24 * 4
    torch.testing.assert_close(got[1:, 3:7].cpu(), block(x, w, b)[1:, 3:7], atol=1e-5, rtol=1e-5)


def test_new_values_and_scalars_of_a_remembered_call_are_read():
    x = torch.randn(2, 35, 17)
    dx = x.to("tpu")
    for n in (33, 34):
        (torch.randn(2, n, 17).to("tpu").relu() * 2.0).sum(1).cpu()
    h, dh = x.relu(), dx.relu()
    for k in range(4):
        scale = 0.5 + k  # a runtime scalar: the same signature
        torch.testing.assert_close((dh * scale).sum(1).cpu(), (h * scale).sum(1), atol=1e-5, rtol=1e-5)
        dh.add_(1.0)  # in place: a new buffer in the same padded layout
        h.add_(1.0)
    assert debug.stats()["dynamic_hit_path_hits"] > 0


def test_windows_of_one_padded_storage_at_other_offsets_are_other_calls():
    for n in (33, 34):
        torch.randn(n, 16).to("tpu").exp().cpu()
    x = torch.randn(35, 16)
    dx, ex = x.to("tpu").exp(), x.exp()  # padded: rows 35 of the 36-bucket
    for start in (0, 1, 0, 2, 1):
        torch.testing.assert_close((dx[:, start:start + 8] * 2).sum(0).cpu(),
                                   (ex[:, start:start + 8] * 2).sum(0), atol=1e-4, rtol=1e-5)


def test_a_remembered_launch_keeps_its_device_checks():
    w = torch.randn(50, 8)
    dw = w.to("tpu")

    def ids_of(n, bad=False):  # padded ids (a dynamic cat's result), as a decode step's
        a, b = torch.randint(0, 50, (2, n)), torch.randint(0, 50, (2, 1))
        if bad:
            b[1, 0] = 77
        return torch.cat([a, b], 1), torch.cat([a.to("tpu"), b.to("tpu")], 1)

    for n in (33, 34, 35, 35):
        ids, dids = ids_of(n)
        torch.testing.assert_close(F.embedding(dids, dw).cpu(), F.embedding(ids, w))
    debug.reset_stats()
    _, bad = ids_of(35, bad=True)
    with pytest.raises(IndexError, match="index out of range"):
        F.embedding(bad, dw).cpu()
    assert debug.stats()["dynamic_hit_path_hits"] == 1  # the embedding (the cat pads its fresh inputs)
    ids, dids = ids_of(35)  # and the next call is fine
    torch.testing.assert_close(F.embedding(dids, dw).cpu(), F.embedding(ids, w))


def test_switching_to_exact_shapes_forgets_remembered_launches():
    x = torch.randn(35, 18)
    for n in (33, 34, 35, 35):
        torch.randn(n, 18).to("tpu").tanh().cpu()
    dx = x.to("tpu")
    with dynamic.dynamic_shapes("0"):
        debug.reset_stats()
        torch.testing.assert_close(torch.tanh(dx).cpu(), torch.tanh(x))
        assert debug.stats()["dynamic_hits"] == 0


def test_a_hint_after_a_remembered_launch_is_still_propagated():
    for n in (33, 34, 35, 35):
        (torch.randn(n, 20).to("tpu").sigmoid() + 1).cpu()
    y = torch.randn(35, 20).to("tpu").sigmoid()  # padded, its layout remembered with the adds
    y + 1
    y[:, 1:] + 1
    torch_tpu.mark_dynamic(y, 0)
    debug.reset_stats()
    assert torch_tpu.dynamic.dim_hints(y + 1)[0] == "dynamic"
    y[:, 1:] + 1  # a view of it: the full path reads its base's hints too
    assert debug.stats()["dynamic_hit_path_hits"] == 0
    # Calls without hints keep the hit path after hints were used.
    z = torch.randn(35, 20).to("tpu").sigmoid()
    z + 1
    debug.reset_stats()
    torch.testing.assert_close((z + 1).cpu(), z.cpu() + 1)
    assert debug.stats()["dynamic_hit_path_hits"] == 1


def test_a_training_step_at_a_warm_length_is_all_hit_path_and_equal_to_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 5))
    dev = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 5))
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("tpu")

    def step(model, x):
        model.zero_grad()
        loss = model(x).log_softmax(-1).mean()
        loss.backward()
        return loss

    for n in (33, 34):
        step(dev, torch.randn(2, n, 12).to("tpu"))
    x = torch.randn(2, 35, 12)
    step(dev, x.to("tpu"))  # the full path: each launch remembered
    debug.reset_stats()
    loss = step(dev, x.to("tpu"))
    torch.testing.assert_close(loss.cpu(), step(cpu, x), atol=1e-5, rtol=1e-5)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-5, rtol=1e-4)
    s = debug.stats()
    assert s["compiles"] == 0, s["compiles_by_op"]
    assert s["dynamic_hit_path_hits"] >= 6, s  # linears (rows), their weight gradients (contracted rows), ...


def test_the_last_token_of_a_growing_batch_compiles_nothing_and_stays_on_device():
    """A decode loop's token bookkeeping at batch 3: ids = cat(ids, next);
    ids[:, -1:] read each step. Its window starts at the real length - 1."""
    def loop(ids, steps):
        outs = []
        for _ in range(steps):
            last = ids[:, -1:].clone()
            outs.append(last)
            ids = torch.cat([ids, (last * 7 + 3) % 251], dim=1)
        return ids, outs

    for b in (4, 5):  # the batch dim turns dynamic; lengths 33..47 warm the sequence's buckets
        loop(torch.randint(0, 251, (b, 33)).to("tpu"), 14)
    ids, _ = loop(torch.randint(0, 251, (3, 37)), 2)
    dev_ids, _ = loop(ids[:, :37].to("tpu"), 2)  # padded now, as a decode step's ids
    torch.tpu.synchronize()
    debug.reset_stats()
    got_ids, got = loop(dev_ids, 9)  # reads lengths 39..47: the last token at 46 never read before
    s = debug.stats()
    want_ids, want = loop(ids, 9)
    assert s["compiles"] == 0, s["compiles_by_op"]
    assert s["transfers_to_host"] == 0, s  # never padded again through the host
    torch.testing.assert_close(got_ids.cpu(), want_ids)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_exact_calls_on_windows_of_a_padded_storage_take_the_hit_path():
    # A decode step's last token, x[:, -1:], cloned or added to out of a
    # padded storage: an exact executable reads it at its place in the
    # padded buffer, which the storage's layout and the view's offset fix.
    with dynamic.dynamic_shapes("1"):
        x = torch.randn(2, 37, 16)
        dx = x.to("tpu") * 1.0  # padded (rows 37 of 40)
        y = torch.randn(2, 35, 16)
        dy = y.to("tpu") * 1.0  # the same layout, other real rows
    assert torch_tpu._C._padded_shape(dx) == torch_tpu._C._padded_shape(dy) != [2, 37, 16]
    one = torch.randn(2, 1, 16)
    done = one.to("tpu")
    for k in range(4):
        debug.reset_stats()
        for a, da in ((x, dx), (y, dy)):  # other offsets of the last row: other signatures
            torch.testing.assert_close(da[:, -1:].clone().cpu(), a[:, -1:].clone())
            torch.testing.assert_close((da[:, -1:] + done).cpu(), a[:, -1:] + one)
            torch.testing.assert_close((da[:, 2:3] * k).cpu(), a[:, 2:3] * k)
        s = debug.stats()
        assert s["compiles"] == 0 or k == 0, s["compiles_by_op"]
        if k >= 2:  # miss, full-path hit (remembered), then the hit path
            assert s["hit_path_hits"] == s["executions"], s
        dx.add_(1.0)  # new values in the same layout: read by the next calls
        x.add_(1.0)


def _fresh_fills_and_copies(ids):
    """HF generate()'s pattern: fresh tensors filled (torch.full, ones) and
    an integer tensor copied to float (`.to(dtype)`), at the batch's sizes."""
    b, n = ids.shape
    mask = torch.full((b, n), 2, device=ids.device)  # empty + fill_
    ones = torch.ones(b, n, 4, device=ids.device)
    pos = ids.to(torch.float32)  # empty + copy_ with a conversion
    return (pos * mask).unsqueeze(-1) + ones


def test_fills_and_copies_into_fresh_tensors_take_the_hit_path():
    for n in (33, 34):  # static, then the 36-bucket
        _fresh_fills_and_copies(torch.randint(0, 9, (3, n)).to("tpu") + 0).cpu()
    ids = torch.randint(0, 9, (3, 35))
    _fresh_fills_and_copies(ids.to("tpu") + 0).cpu()  # the full path, each launch remembered
    debug.reset_stats()
    for k in range(3):
        x = ids + k
        dx = x.to("tpu") + 0  # padded through the host: this add takes the full path
        got = _fresh_fills_and_copies(dx)
        torch.testing.assert_close(got.cpu(), _fresh_fills_and_copies(x))
    s = debug.stats()
    assert s["compiles"] == 0, s["compiles_by_op"]
    # Per call: add, then fill_, fill_, copy_, mul, add on bounded executables, all but the first by the hit path.
    assert s["dynamic_hits"] == 18 and s["dynamic_hit_path_hits"] == 15, s
    assert got.untyped_storage().nbytes() == 3 * 35 * 4 * 4


def test_a_copy_over_a_tensor_its_views_see_on_the_hit_path():
    """copy_ overwrites a whole tensor the module does not read: the hit path
    gives its storage the new (padded) buffer; a view taken before sees it."""
    for n in (33, 34):  # a fresh destination, then the same one again (padded at 34)
        dest = torch.empty(2, n, device="tpu")
        for _ in range(2):
            dest.copy_(torch.randn(2, n).to("tpu").exp()).cpu()
    dest = torch.empty(2, 35, device="tpu")
    view = dest[1, 3:9]
    ptr = dest.data_ptr()
    launches = []
    for k in range(4):
        src = torch.randn(2, 35)
        debug.reset_stats()
        dest.copy_(src.to("tpu").exp())
        s = debug.stats()
        launches.append((s["compiles"], s["dynamic_hits"], s["dynamic_hit_path_hits"]))
        torch.testing.assert_close(dest.cpu(), src.exp())
        torch.testing.assert_close(view.cpu(), src.exp()[1, 3:9])
    assert dest.data_ptr() == ptr and dest.untyped_storage().nbytes() == 2 * 35 * 4
    # exp, then copy_: the first call into the fresh tensor, the second into the
    # padded one take the full path; the later ones are theirs again (copy_ by the hit path).
    assert launches == [(0, 2, 0), (0, 2, 0), (0, 2, 1), (0, 2, 1)], launches


def test_an_overwrite_in_fused_eager_keeps_the_chain_reading_the_old_value():
    """A remembered copy_ into a padded tensor, while fused eager has recorded
    a read of that tensor: the chain reads the value before the copy."""
    for n in (33, 34):
        dest = torch.empty(2, n, device="tpu")
        for _ in range(2):
            dest.copy_(torch.randn(2, n).to("tpu").exp()).cpu()
    x = torch.empty(2, 35, device="tpu")
    for _ in range(2):  # fresh, then padded: both launches remembered
        x.copy_(torch.randn(2, 35).to("tpu").exp())
    src = torch.randn(2, 35).to("tpu").exp()
    old = x.cpu()
    with torch_tpu.fused():
        y = x * 2  # recorded: reads x
        x.copy_(src)
        got = y.cpu()
    torch.testing.assert_close(got, old * 2)
    torch.testing.assert_close(x.cpu(), src.cpu())
