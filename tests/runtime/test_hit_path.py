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
