"""The op_db sweep's comparisons that are not plain allclose: ties of an
unstable sort, feature dropout's per-channel pooling, seeds of ops that
depend on their draws only rarely. Each must also reject a wrong result."""
import types

import torch
from torch.testing._internal.opinfo.core import SampleInput

from torch_tpu.tools import _opdb_worker as w


def _op(name):
    return types.SimpleNamespace(name=name)


def test_sort_ties_in_either_order_pass_and_wrong_indices_fail():
    x = torch.tensor([3.0, 1.0, 3.0, 2.0, 1.0])
    s = SampleInput(x, args=(0, False))
    cpu = torch.sort(x)
    tie_swapped = (cpu.values, torch.tensor([4, 1, 3, 2, 0]))  # the two 1s and the two 3s swapped
    assert not torch.equal(tie_swapped[1], cpu.indices)
    assert w._ties_only(_op("sort"), s, tie_swapped, tuple(cpu))
    wrong = (cpu.values, torch.tensor([1, 4, 3, 0, 0]))  # picks position 0 twice
    assert not w._ties_only(_op("sort"), s, wrong, tuple(cpu))
    stable = SampleInput(x, kwargs={"dim": 0, "stable": True})
    assert not w._ties_only(_op("sort"), stable, tie_swapped, tuple(cpu))  # stable: order is defined


def test_argsort_and_topk_ties():
    x = torch.tensor([[2.0, 5.0, 2.0, 5.0]])
    e = torch.argsort(x, dim=1)
    assert w._ties_only(_op("argsort"), SampleInput(x, args=(1,)), torch.tensor([[2, 0, 3, 1]]), e)
    assert not w._ties_only(_op("argsort"), SampleInput(x, args=(1,)), torch.tensor([[0, 1, 2, 3]]), e)
    top = torch.topk(x, 2, 1)
    assert w._ties_only(_op("topk"), SampleInput(x, args=(2, 1)), (top.values, top.indices.flip(1)), tuple(top))


def test_feature_dropout_pools_one_value_per_channel():
    first = w._one_per_channel(_op("nn.functional.dropout3d"))
    assert first(torch.zeros(2, 3, 4, 5, 6)).shape == (2, 3)
    assert first(torch.zeros(3, 4, 5, 6)).shape == (3,)  # unbatched (C, D, H, W)
    assert w._one_per_channel(_op("nn.functional.feature_alpha_dropout"))(torch.zeros(2, 3, 4)).shape == (2, 3)
    assert w._one_per_channel(_op("nn.functional.dropout"))(torch.zeros(2, 3)).shape == (2, 3)


def test_distribution_still_rejects_a_different_drop_rate():
    # channel values of p=0.5 dropout against p=0.1 dropout: one value per channel, 60 channels
    g = torch.Generator().manual_seed(0)
    e = (torch.rand(60, generator=g) > 0.5).double()
    a = (torch.rand(60, generator=g) > 0.1).double()
    try:
        w._distribution(a, e)
    except AssertionError:
        return
    raise AssertionError("KS test accepted p=0.1 against p=0.5")


def test_a_cpu_nan_where_float64_has_a_number_needs_tpu_close_to_float64():
    from torch_tpu.tools.opinfo_compare import closer_to_exact
    exact = torch.tensor([1.0, 2.0, float("nan")], dtype=torch.float64)
    cpu = torch.tensor([1.0, float("nan"), float("nan")], dtype=torch.bfloat16)
    close = torch.tensor([1.0, 2.0078125, float("nan")], dtype=torch.bfloat16)
    assert closer_to_exact(close, cpu, exact)
    far = torch.tensor([1.0, 2.5, float("nan")], dtype=torch.bfloat16)
    assert not closer_to_exact(far, cpu, exact)
    tpu_nan_lost = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)  # the float64 NaN must stay
    assert not closer_to_exact(tpu_nan_lost, cpu, exact)
