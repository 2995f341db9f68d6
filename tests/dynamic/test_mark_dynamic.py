"""torch_tpu.mark_dynamic / mark_static: hints for eager (csrc/aten/dynamic.cpp)
and forwarded to torch._dynamo.

A marked dynamic dim runs bounded from the first call in every mode (bound:
max when the size fits, else its bucket); a marked static dim never runs
dynamic. Results equal CPU; compile counts asserted. Column counts (41..)
differ from test_dynamic_eager.py's so that signatures do not share state.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import debug, dynamic


@pytest.fixture(autouse=True)
def fresh_sizes():
    dynamic.forget_sizes()
    yield


def run_marked(fn, make, sizes, mark, atol=1e-5, rtol=1.3e-6):
    """For each size: fn on CPU and on tpu inputs that `mark` hints; returns stats."""
    debug.reset_stats()
    for n in sizes:
        args = make(n)
        expected = fn(*args)
        dev = [a.to("tpu") for a in args]
        mark(dev)
        got = fn(*dev).cpu()
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    s = debug.stats()
    assert s["fallbacks"] == {}, s["fallbacks"]
    assert s["dynamic_exact_fallbacks"] == 0, s
    return s


def test_marked_dim_is_dynamic_from_the_first_call_in_mode_0():
    with dynamic.dynamic_shapes("0"):
        s = run_marked(torch.exp, lambda n: (torch.randn(n, 41),), (9, 10, 12, 15),
                       lambda d: torch_tpu.mark_dynamic(d[0], 0))
    assert s["compiles"] == 1 and s["dynamic_executables"] == 1 and s["dynamic_hits"] == 3, s


def test_max_is_the_bound_torchtpu_spelling():
    # lower, upper positionally (TorchTPU's mark_dynamic(tensor, dim, lower, upper)):
    # one executable at 40 for sizes that would take buckets 16, 18 and 36.
    with dynamic.dynamic_shapes("0"):
        s = run_marked(lambda x: x.sum(0), lambda n: (torch.randn(n, 42),), (5, 17, 33, 40),
                       lambda d: torch_tpu.mark_dynamic(d[0], 0, 2, 40), atol=1e-4)
    assert s["compiles"] == 1 and s["dynamic_executables"] == 1 and s["dynamic_hits"] == 3, s


def test_a_size_past_max_takes_its_bucket():
    with dynamic.dynamic_shapes("0"):
        s = run_marked(torch.exp, lambda n: (torch.randn(n, 43),), (5, 6, 20),
                       lambda d: torch_tpu.mark_dynamic(d[0], 0, max=8))
    # 5, 6: the 8 bound; 20: bucket 20.
    assert s["compiles"] == 2 and s["dynamic_executables"] == 2 and s["dynamic_hits"] == 1, s


def test_a_list_of_dims():
    with dynamic.dynamic_shapes("0"):
        s = run_marked(torch.tanh, lambda n: (torch.randn(n, n + 29),), (5, 6, 7),
                       lambda d: torch_tpu.mark_dynamic(d[0], [0, -1]))
    assert s["compiles"] == 1 and s["dynamic_hits"] == 2, s


def test_the_hint_follows_through_a_chain_of_dynamic_ops():
    w = torch.randn(9, 44)

    def block(x, w):
        return F.gelu(F.linear(x, w)).sum(-1)

    with dynamic.dynamic_shapes("0"):
        s = run_marked(block, lambda n: (torch.randn(n, 44), w), (5, 6, 7),
                       lambda d: torch_tpu.mark_dynamic(d[0], 0), atol=1e-4, rtol=1e-5)
    # mm (linear), gelu, sum: one dynamic executable each, for every size.
    assert s["compiles"] == 3 and s["dynamic_executables"] == 3 and s["dynamic_hits"] == 6, s
    y = torch.exp(_marked(torch.randn(5, 44)))
    assert dynamic.dim_hints(y) == ["dynamic", ""]


def test_a_view_merging_the_marked_dim_is_dynamic():
    # x [2, n, 45] marked in n, read by a linear as its [2n, 45] rows (a view
    # of x, which carries no hint of its own): the rows run bounded by 2 * 64.
    w = torch.randn(7, 45)
    with dynamic.dynamic_shapes("0"):
        s = run_marked(lambda x, w: F.linear(x, w), lambda n: (torch.randn(2, n, 45), w), (33, 35, 40),
                       lambda d: torch_tpu.mark_dynamic(d[0], 1, 2, 64), atol=1e-4, rtol=1e-5)
    assert s["compiles"] == 1 and s["dynamic_hits"] == 2, s
    d = torch.randn(2, 5, 45).to("tpu")
    torch_tpu.mark_dynamic(d, 1, 2, 64)
    assert dynamic.dim_hints(d.view(10, 45)) == ["", ""]  # read off the base per call, not stored


def test_an_unmarked_partner_of_the_same_size_follows_the_hint():
    # x is marked, y (a fresh tensor of the same shape) is not: add's shapes
    # must agree at the bound, so y's dim follows x's (one executable).
    with dynamic.dynamic_shapes("0"):
        s = run_marked(torch.add, lambda n: (torch.randn(2, n, 49), torch.randn(2, n, 49)), (33, 35, 40),
                       lambda d: torch_tpu.mark_dynamic(d[0], 1, 2, 64))
    assert s["compiles"] == 1 and s["dynamic_hits"] == 2, s


def _marked(x):
    d = x.to("tpu")
    torch_tpu.mark_dynamic(d, 0)
    return d


def test_marked_static_never_goes_dynamic_in_auto():
    with dynamic.dynamic_shapes("auto"):
        s = run_marked(torch.exp, lambda n: (torch.randn(n, 45),), (5, 6, 7),
                       lambda d: torch_tpu.mark_static(d[0], 0))
    assert s["compiles"] == 3 and s["dynamic_executables"] == 0, s


def test_marked_static_wins_over_mode_1():
    with dynamic.dynamic_shapes("1"):
        s = run_marked(torch.exp, lambda n: (torch.randn(n, 46),), (5, 6),
                       lambda d: torch_tpu.mark_static(d[0], 0))
    # dim 1 (46) dynamic at bucket 48, dim 0 exact: one executable per row count.
    assert s["compiles"] == 2 and s["dynamic_executables"] == 2, s


def test_forwarded_to_dynamo():
    x = torch.randn(5, 47, device="tpu")
    torch_tpu.mark_dynamic(x, 0, min=2, max=64)
    torch_tpu.mark_static(x, 1)
    assert x._dynamo_dynamic_indices == {0} and x._dynamo_static_indices == {1}
    assert dynamic.dim_hints(x) == ["dynamic", "static"]


def test_torch_compile_sees_the_mark():
    import torch._dynamo

    graphs = []

    def counting(gm, example_inputs):
        graphs.append([n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"])
        return torch_tpu.compile.backend(gm, example_inputs)

    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.relu(x) * 2, backend=counting)
    for n in (5, 6):
        x = torch.randn(n, 48)
        d = x.to("tpu")
        torch_tpu.mark_dynamic(d, 0)
        torch.testing.assert_close(fn(d).cpu(), torch.relu(x) * 2)
    # One Dynamo graph, traced with a symbolic dim 0, for both sizes.
    assert len(graphs) == 1, graphs
    tensors = [v for v in graphs[0] if isinstance(v, torch.Tensor)]
    assert isinstance(tensors[0].shape[0], torch.SymInt) and tensors[0].shape[1] == 48, graphs


@pytest.mark.parametrize("call, error, match", [
    (lambda x: torch_tpu.mark_dynamic(x, 2), ValueError, "out of range"),
    (lambda x: torch_tpu.mark_dynamic(x, 0, 10, 4), ValueError, "larger than max"),
    (lambda x: torch_tpu.mark_dynamic(x, 0, max=1), ValueError, "at least 2"),
    (lambda x: torch_tpu.mark_dynamic(x, "0"), TypeError, "must be ints"),
    (lambda x: torch_tpu.mark_static([1, 2], 0), TypeError, "expected a tensor"),
])
def test_bad_hints_are_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.zeros(3, 4, device="tpu"))
