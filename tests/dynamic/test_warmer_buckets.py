"""A call whose own combination of buckets has no executable yet takes
larger buckets its dims have run at (csrc/aten/dynamic.cpp:
TakeWarmerBuckets), when no input is then padded past 1.25x its elements, or,
up to 1.5x a dim's size, when that adds at most 1 MiB to each tensor
(TORCH_TPU_PADDING_SLACK_BYTES).
"""
from __future__ import annotations

import pytest
import torch

from torch_tpu import debug, dynamic


@pytest.fixture(autouse=True)
def auto_mode():
    dynamic.forget_sizes()
    with dynamic.dynamic_shapes("auto"):
        yield


def stats_of_a_new_pair(fn, pair, warm, new):
    """Runs fn on tpu at the `warm` sizes, then at `new` on tpu and on the CPU
    (equal results); the stats of the new call."""
    for sizes in warm:
        fn(*[t.to("tpu") for t in pair(*sizes)]).cpu()
    debug.reset_stats()
    args = pair(*new)
    torch.testing.assert_close(fn(*[t.to("tpu") for t in args]).cpu(), fn(*args), atol=1e-6, rtol=1e-5)
    return debug.stats()


def test_a_new_combination_of_warm_buckets_takes_a_larger_warm_one():
    """Two dynamic dims (a prompt and a cache length): (35, 45) after (34, 41)
    and (38, 45) has its own buckets (36, 48) uncompiled together; it runs on
    the (40, 48) executable instead of compiling, with CPU's results."""
    def f(a, b):
        return (a + b).softmax(-1) * 2.0

    def pair(n, m):
        return torch.randn(n, 1), torch.randn(1, m)

    s = stats_of_a_new_pair(f, pair, ((33, 40), (34, 41), (38, 45)), (35, 45))
    assert s["compiles"] == 0, s["compiles_by_op"]


def f(x):
    return (x * 2.0).softmax(-1)


@pytest.mark.parametrize("shape, new, compiles", [
    (lambda n: (n,), 34, False),           # 34 in the 40-bucket: 1.18x its elements
    (lambda n: (n, n), 34, False),         # 34x34 in 40x40: 1.38x, but 1.8 KiB more: affordable
    (lambda n: (n, n, 1024), 34, True),    # ... 1.9 MiB more than exact (> 1 MiB): its own 36-bucket
    (lambda n: (n, 8), 26, True),          # 26 in 40: 1.54x its size, past 1.5x: its own 26-bucket
])
def test_a_larger_warm_bucket_pads_a_quarter_or_costs_little(shape, new, compiles):
    for n in (33, 40):  # static, then the 40-bucket
        f(torch.randn(*shape(n)).to("tpu")).cpu()
    debug.reset_stats()
    x = torch.randn(*shape(new))
    torch.testing.assert_close(f(x.to("tpu")).cpu(), f(x), atol=1e-6, rtol=1e-5)
    s = debug.stats()
    assert (s["compiles"] > 0) == compiles, s["compiles_by_op"]
    if compiles:
        assert s["dynamic_compiles_by_op"], s  # its own bucket, bounded-dynamic
    else:
        assert s["dynamic_hits"] >= 2, s


def test_a_batch_and_a_length_of_one_size_take_their_own_warm_buckets():
    """A batch of 3 and a length of 3 would share the larger of their buckets
    (8, 8), which never ran; each dim's own (8 for the batch after batch 5, 4
    for the length) ran together at (5, 3): no compile, CPU's results."""
    def g(x, y):
        return torch.cat([x * 2.0, y], dim=1).sum(1)

    def pair(b, n):
        return torch.randn(b, n), torch.randn(b, 1)

    s = stats_of_a_new_pair(g, pair, ((4, 5), (5, 3)), (3, 3))  # (4, 5) static, then buckets (8, 4)
    assert s["compiles"] == 0, s["compiles_by_op"]
    assert s["dynamic_hits"] >= 3, s
