"""The launch floor that benchmarks/op_overhead.py reports: one eager op's
launch, replayed by the runtime alone."""
import pytest
import torch

import torch_tpu


def test_replays_the_ops_launch():
    a, b = torch.randn(16, 16, device="tpu"), torch.randn(16, 16, device="tpu")
    before = torch_tpu.debug.stats()["executions"]
    seconds = torch_tpu._C._launch_floor(lambda: a + b, 5)
    assert 0 < seconds < 1
    # The op itself ran once through the eager path; the replays bypass it.
    assert torch_tpu.debug.stats()["executions"] - before == 1
    # The replays donate nothing: the inputs still hold their values.
    torch.testing.assert_close((a + b).cpu(), a.cpu() + b.cpu())


def test_an_op_without_a_launch_is_an_error():
    a = torch.randn(4, device="tpu")
    with pytest.raises(ValueError, match="launched no executable"):
        torch_tpu._C._launch_floor(lambda: a.view(2, 2), 3)


def test_the_ops_error_propagates_and_capture_ends():
    def bad():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        torch_tpu._C._launch_floor(bad, 3)
    a = torch.ones(3, device="tpu")
    assert (a + a).cpu().tolist() == [2.0, 2.0, 2.0]
