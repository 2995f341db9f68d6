"""Fused eager: recorded chains run as one module, results as strict eager."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import torch_tpu


def chain(x, w):
    return ((x @ w).relu() * 2 + 1).softmax(-1).sum(0)


# Sizes other tests of this process showed the dynamic policy would make these
# ops' signatures dynamic, and a call at a new size of a dynamic signature runs
# alone in fused eager (README: bounded dynamic shapes): start from a fresh
# process's policy.
@pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py
def test_chain_matches_strict_and_compiles_once():
    # Uploaded, and the strict run reads clones: a storage made or read by a
    # dynamic op (one runs dynamic when another test saw other sizes) keeps a
    # padded buffer, and the first flush would add one compaction per input
    # (README: bounded dynamic shapes).
    x, w = torch.randn(32, 32).to("tpu"), torch.randn(32, 32).to("tpu")
    strict = chain(x.clone(), w.clone()).cpu()
    torch_tpu.debug.reset_stats()
    with torch_tpu.fused():
        outs = [chain(x, w).cpu() for _ in range(4)]
    s = torch_tpu.debug.stats()
    assert s["compiles"] <= 1  # the chain compiles once (0 if the disk cache had it)
    assert s["executions"] == 4  # one module per chain, not one per op
    for out in outs:
        torch.testing.assert_close(out, strict, rtol=1e-6, atol=1e-6)


def test_views_and_inplace_inside_a_chain():
    def program(dev):
        x = torch.arange(24, dtype=torch.float32, device=dev).reshape(4, 6)
        y = x[:, 1:3]
        y.mul_(10)
        x.t()[2].add_(1)
        z = x.clone()
        z[::2] = -z[::2]
        return x, y, z, x.sum()

    expected = program("cpu")
    with torch_tpu.fused():
        got = program("tpu")
        results = [t.cpu() for t in got]
    for g, e in zip(results, expected):
        torch.testing.assert_close(g, e)


def test_a_storage_read_as_another_dtype_mid_chain():
    """A storage the chain holds as a parameter, then read as another dtype
    (a view(dtype): its bytes are reinterpreted, a new buffer), then read
    again as its own dtype: the later read sees the float values, not the
    first parameter's int32 bits converted."""
    def program(dev):
        a = torch.arange(6, dtype=torch.float32, device=dev).reshape(2, 3) * 1
        b = a.view(torch.int32) + 0
        return b, a + 1

    ref = program("cpu")
    with torch_tpu.fused():
        out = program("tpu")
    for o, r in zip(out, ref):
        assert torch.equal(o.cpu(), r)


def test_sync_points_inside_fused_mode():
    with torch_tpu.fused():
        x = torch.ones(5, device="tpu") * 3
        assert x.sum().item() == 15.0  # .item() flushes
        assert "3." in repr(x)  # printing flushes
        # An op without a native rule runs through the CPU fallback mid-chain.
        y = (x + 1).cumsum(0) if False else torch.special.i0(x + 1)
        torch.testing.assert_close(y.cpu(), torch.special.i0(torch.full((5,), 4.0)))
        torch.tpu.synchronize()


def test_a_rule_that_cannot_lower_its_arguments_falls_back_mid_chain():
    """A chain is emitted when it first runs, long after its calls were
    recorded; the first call of each signature is emitted at once, so a rule
    that cannot lower its arguments (bessel_j0 in float64) still takes the CPU
    fallback in the middle of a chain, every time it is called."""
    x = torch.linspace(0.5, 4, 7, dtype=torch.float64)
    torch_tpu.debug.reset_stats()
    with torch_tpu.fused():
        for _ in range(2):
            got = torch.special.bessel_j0(x.to("tpu") * 2) + 1
            torch.testing.assert_close(got.cpu(), torch.special.bessel_j0(x * 2) + 1)
    assert torch_tpu.debug.stats()["fallbacks"] == {"special_bessel_j0.out": 2}


def test_a_destination_freed_before_the_flush_is_no_result():
    """Recorded calls hold no tensors: an in-place destination that dies
    before its chain runs is not one of the chain's results, and the values
    that are stay right."""
    def program(dev):
        kept = torch.arange(6.0, device=dev)
        for _ in range(3):
            gone = kept * 2
            gone.add_(1)  # written in place, then freed before the flush
            kept = kept + gone.sum()
        return kept

    with torch_tpu.fused():
        got = program("tpu").cpu()
    torch.testing.assert_close(got, program("cpu"))


def test_a_signature_recorded_again_takes_each_calls_values():
    """After its first call a signature is recorded from its fingerprint,
    without planning: its parameters come from each call's own arguments
    (scalars, view offsets, an input pending in the chain, one storage read
    twice), so every call's values are right."""
    base = torch.randn(6, 8)

    def program(x, k):
        y = x * (k + 0.5)  # a new scalar per call
        z = y[k % 3:k % 3 + 2] + x[1:3]  # a pending input at a new offset
        w = torch.add(z, z, alpha=k)  # one storage read twice
        return w.relu() - y.sum(0)

    x = base.to("tpu")
    with torch_tpu.fused():
        got = [program(x, k).cpu() for k in range(5)]
    for k, g in enumerate(got):
        torch.testing.assert_close(g, program(base, k), rtol=1e-6, atol=1e-5)


def test_temporaries_freed_before_the_flush():
    with torch_tpu.fused():
        x = torch.randn(8, device="tpu")
        for _ in range(5):
            x = x * 1.5 - 0.25  # each intermediate dies before the flush
        got = x.cpu()
    y = torch.tpu.manual_seed  # noqa: F841 (keeps the namespace import used)
    assert torch.isfinite(got).all()


def test_training_steps_match_strict():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    data = torch.randn(32, 8)
    target = torch.randn(32, 1)

    def train(fused: bool):
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        m.load_state_dict(model.state_dict())
        m.to("tpu")
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        x, t = data.to("tpu"), target.to("tpu")
        losses = []
        with torch_tpu.fused(fused):
            for _ in range(5):
                opt.zero_grad()
                loss = nn.functional.mse_loss(m(x), t)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses, [p.detach().cpu() for p in m.parameters()]

    strict_losses, strict_params = train(False)
    torch_tpu.debug.reset_stats()
    fused_losses, fused_params = train(True)
    for a, b in zip(fused_losses, strict_losses):
        assert a == pytest.approx(b, rel=1e-5)
    for a, b in zip(fused_params, strict_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_env_var_turns_it_on_for_the_process():
    code = ("import torch, torch_tpu; x = torch.ones(3).to('tpu'); y = (x * 2 + 1).sum(); "
            "print(torch_tpu._C._fusion_enabled(), y.item(), torch_tpu.debug.stats()['executions'])")
    env = dict(os.environ, TORCH_TPU_DEFER_AND_FUSE="1", TORCH_TPU_DYNAMIC_SHAPES="auto")  # 1: ops alone
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    enabled, value, executions = out.stdout.split()
    assert enabled == "True" and float(value) == 9.0
    assert int(executions) == 1  # mul, add, sum: one module
