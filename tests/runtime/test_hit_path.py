"""The hit path of strict eager (csrc/aten/call_fast.cpp): a functional call
whose signature ran before is launched from a fingerprint of its arguments.
Every variation below must still give PyTorch's CPU result, and a repeated
signature must not compile again."""
import torch

import torch_tpu


def _stats():
    s = torch_tpu.debug.stats()
    return s["compiles"] + s["disk_hits"], s["cache_hits"]


def _check(fn, *cpu_args):
    tpu_args = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    for _ in range(3):  # miss, full-path hit (remembered), hit path
        got = fn(*tpu_args)
        torch.testing.assert_close(got.cpu(), fn(*cpu_args))


def test_repeated_signature_hits_without_compiling():
    a, b = torch.randn(16, 8, device="tpu"), torch.randn(16, 8, device="tpu")
    a + b
    a + b
    compiled, hits = _stats()
    for alpha in (1, 2, -3, 0.5, 1.25):  # scalars are runtime parameters
        torch.testing.assert_close(torch.add(a, b, alpha=alpha).cpu(),
                                   torch.add(a.cpu(), b.cpu(), alpha=alpha))
    after, hits_after = _stats()
    # int and float alphas are two signatures at most
    assert after - compiled <= 2
    assert hits_after - hits >= 3


def test_aliasing_views_and_strides_are_part_of_the_signature():
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    a, b = x.to("tpu"), y.to("tpu")
    for _ in range(3):
        torch.testing.assert_close((a + b).cpu(), x + y)
    # same shapes, other aliasing / geometry: must not reuse a + b's executable
    for _ in range(3):
        torch.testing.assert_close((a + a).cpu(), x + x)
        torch.testing.assert_close((a.t() + b).cpu(), x.t() + y)
        torch.testing.assert_close((a[1:] + a[:-1]).cpu(), x[1:] + x[:-1])
        torch.testing.assert_close((a[2:] + b[:-2]).cpu(), x[2:] + y[:-2])
        torch.testing.assert_close((a[:, 1:] + b[:, :-1]).cpu(), x[:, 1:] + y[:, :-1])


def test_dtypes_ints_and_lists():
    x = torch.randn(6, 5)
    _check(lambda t: t + 3, x)
    _check(lambda t: t * 2.5, x)
    _check(lambda t: t.int() + 2, x)
    _check(lambda t: t.sum(1), x)
    _check(lambda t: t.sum(0, keepdim=True), x)
    _check(lambda t: t.permute(1, 0).reshape(5, 6) * 1.0, x)
    _check(lambda t: torch.softmax(t, 1), x)


def test_new_values_of_a_storage_are_read():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    a, b = x.to("tpu"), y.to("tpu")
    for k in range(4):
        torch.testing.assert_close((a + b).cpu(), x + y)
        b.add_(1.0)  # in place: the next a + b reads the new buffer
        y.add_(1.0)
        a = a * 2  # a fresh storage each time
        x = x * 2


def test_fused_mode_records_instead_of_launching():
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    a, b = x.to("tpu"), y.to("tpu")
    # Exact shapes: under "auto" the 4x4 adds above make this signature
    # dynamic, its first call pads a and b, and the fused chain below then
    # compacts them (two executions that are not the hit path's).
    with torch_tpu.dynamic.dynamic_shapes("0"):
        for _ in range(3):
            a + b  # the signature is on the hit path now
    torch.tpu.synchronize()
    with torch_tpu.fused():
        before = torch_tpu.debug.stats()["executions"]
        c = a + b
        d = c + b
        assert torch_tpu.debug.stats()["executions"] == before  # recorded, not run
        got = d.cpu()
    torch.testing.assert_close(got, x + y + y)


def test_tensor_lists_are_part_of_the_signature():
    """cat's and stack's tensor lists: their count, each tensor's geometry,
    aliasing and offset (a KV cache's cat, RoPE's halves). Exact shapes: under
    auto, cats of other sizes would turn the signature dynamic (those take the
    hit path as bounded launches: tests/dynamic/test_bounded_hit_path.py)."""
    with torch_tpu.dynamic.dynamic_shapes("0"):
        _check_tensor_lists()


def _check_tensor_lists():
    x, y, z = torch.randn(4, 6), torch.randn(3, 6), torch.randn(4, 6)
    a, b, c = x.to("tpu"), y.to("tpu"), z.to("tpu")
    a.add_(0.5)
    x.add_(0.5)
    for _ in range(3):  # the last rounds launch from the fingerprint
        torch.testing.assert_close(torch.cat([a, b]).cpu(), torch.cat([x, y]))
        torch.testing.assert_close(torch.cat([a, b, a]).cpu(), torch.cat([x, y, x]))
        torch.testing.assert_close(torch.cat([b, a]).cpu(), torch.cat([y, x]))
        torch.testing.assert_close(torch.cat([a[1:], a[:1]]).cpu(), torch.cat([x[1:], x[:1]]))
        torch.testing.assert_close(torch.cat([a[:, 2:], c[:, :4]], 1).cpu(), torch.cat([x[:, 2:], z[:, :4]], 1))
        torch.testing.assert_close(torch.stack([a, c]).cpu(), torch.stack([x, z]))
    compiled, _ = _stats()
    a.add_(1.0)  # new values in the same storage are read
    x.add_(1.0)
    torch_tpu.debug.reset_stats()
    torch.testing.assert_close(torch.cat([a, b]).cpu(), torch.cat([x, y]))
    torch.testing.assert_close(torch.cat([a[:, 1:5], c[:, :4]], 1).cpu(), torch.cat([x[:, 1:5], z[:, :4]], 1))  # another offset
    assert torch_tpu.debug.stats()["hit_path_hits"] == 2
    assert _stats()[0] == 0


def test_random_calls_advance_the_generator_as_the_full_path_does():
    """A call that draws random numbers, launched from its fingerprint,
    advances the generator by the full path's draws: the same seed gives the
    same numbers whether a call took the full path or the hit path, and
    calls in a row differ."""
    import torch.nn.functional as F

    # Uploaded, not filled on tpu: after other tests made fill_'s signature dynamic, a
    # fill's result may be a padded storage, and exact calls on padded storages take the
    # full path.
    x = torch.ones(32, 16).to("tpu")

    def draws():
        torch.manual_seed(0)
        return [F.dropout(x, 0.5).cpu() for _ in range(3)] + [torch.rand(7, device="tpu").cpu()]

    first = draws()  # the first dropout plans (full path), the rest are hits
    torch_tpu.debug.reset_stats()
    again = draws()  # all hit-path launches
    assert torch_tpu.debug.stats()["hit_path_hits"] == 3  # the dropouts (rand is an in-place uniform_)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    kept = first[0] != 0  # dropout keeps about half, scaled by 2
    assert 0.3 < kept.float().mean() < 0.7 and torch.all(first[0][kept] == 2.0)


def test_attention_without_dropout_takes_the_hit_path():
    import torch.nn.functional as F

    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 4, 40, 16)
    dq, dk = q.to("tpu"), k.to("tpu")
    for _ in range(3):
        torch.testing.assert_close(F.scaled_dot_product_attention(dq, dk, dk).cpu(),
                                   F.scaled_dot_product_attention(q, k, k), atol=1e-5, rtol=1e-5)
    torch_tpu.debug.reset_stats()
    torch.testing.assert_close(F.scaled_dot_product_attention(dq, dk, dk).cpu(),
                               F.scaled_dot_product_attention(q, k, k), atol=1e-5, rtol=1e-5)
    s = torch_tpu.debug.stats()
    # .cpu() of its (transposed) result copies it on the device first: in place, also the hit path
    assert s["compiles"] == 0 and s["native_ops"]["_scaled_dot_product_efficient_attention"] == 1
    assert s["hit_path_hits"] == s["executions"] == 2


def _hit_path_hits():
    return torch_tpu.debug.stats()["hit_path_hits"]


def test_in_place_calls_take_the_hit_path_and_write_their_tensor():
    # Exact signatures, as in a fresh process: an add_ or mul_ another test
    # left dynamic pads the fresh exact inputs through the host at every call.
    torch_tpu.dynamic.forget_sizes()
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    a, b = x.to("tpu"), y.to("tpu")
    for k in range(4):
        before = _hit_path_hits()
        alias = a  # the same tensor object comes back, its storage written
        got = a.add_(b, alpha=k + 1)
        x.add_(y, alpha=k + 1)
        assert got is alias
        torch.testing.assert_close(a.cpu(), x)
        b.mul_(0.5)  # another signature, also in place
        y.mul_(0.5)
        torch.testing.assert_close(b.cpu(), y)
        if k >= 2:  # miss, full-path hit (remembered), then the hit path
            assert _hit_path_hits() - before == 2
    # a view of the written storage reads its new values
    torch.testing.assert_close(a[1:3].cpu(), x[1:3])


def test_in_place_fills_of_fresh_tensors_read_as_cpu():
    # Sizes other tests left may have made these signatures dynamic: a bounded
    # copy_ from a fresh exact eye pads it through the host at every call
    # (never remembered). Exact signatures here, as in a fresh process.
    torch_tpu.dynamic.forget_sizes()
    for k in range(4):
        before = _hit_path_hits()
        t = torch.empty(3, 4, device="tpu").fill_(k + 0.5)  # a storage without a buffer yet
        i = torch.empty(5, dtype=torch.int64, device="tpu").fill_(k)
        torch.testing.assert_close(t.cpu(), torch.full((3, 4), k + 0.5))
        torch.testing.assert_close(i.cpu(), torch.full((5,), k, dtype=torch.int64))
        c = torch.empty(2, 2, device="tpu").copy_(torch.eye(2, device="tpu"))
        torch.testing.assert_close(c.cpu(), torch.eye(2))
        if k >= 2:
            assert _hit_path_hits() - before == 3  # both fills and the copy (eye is out=: the full path)


def test_in_place_writes_to_part_of_a_storage_and_aliases_stay_exact():
    x = torch.randn(6, 4)
    a = x.to("tpu")
    for _ in range(3):
        a[1:3].add_(1.0)  # a window of the storage: the full path's write
        x[1:3].add_(1.0)
        a.t().mul_(2.0)  # the whole storage through a transposed view
        x.t().mul_(2.0)
        a.add_(a)  # read and written at once: its buffer is not donated away
        x.add_(x)
        torch.testing.assert_close(a.cpu(), x)
    # a write into one tensor never changes another that shares nothing with it
    b = a.clone()
    for _ in range(3):
        b.sub_(1.0)
    torch.testing.assert_close(a.cpu(), x)
    torch.testing.assert_close(b.cpu(), x - 3.0)


def test_in_place_errors_still_raise_on_the_hit_path():
    a, b = torch.randn(4, 4, device="tpu"), torch.randn(4, 4, device="tpu")
    for _ in range(3):
        a.add_(b)
    c = torch.randn(4, 1, device="tpu")
    for _ in range(2):
        try:
            c.add_(b)  # the result does not fit in c
        except RuntimeError as e:
            assert "size" in str(e) or "shape" in str(e)
        else:
            raise AssertionError("add_ into a smaller tensor did not raise")
    e = torch.randn(4, 4, device="tpu").expand(2, 4, 4)
    for _ in range(2):
        try:
            e.add_(1.0)  # elements that alias each other
        except RuntimeError as err:
            assert "single memory location" in str(err) or "overlap" in str(err)
        else:
            raise AssertionError("add_ into an expanded tensor did not raise")
