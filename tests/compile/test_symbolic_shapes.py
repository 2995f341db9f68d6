"""torch.compile(backend="tpu") with symbolic shapes: one bounded-dynamic
module per size bucket (compile_symbolic.py), not one per concrete shape.

Graphs made symbolic by ``dynamic=True``, by Dynamo's automatic dynamic
shapes (a second length) and by ``torch._dynamo.mark_dynamic``. Each test
compares every result with PyTorch on the CPU, at several lengths inside one
bucket and across buckets (4, 8, 16, then 18, 20, ..., 32, 36, ...), and
counts the modules built (``compile.stats()["bucket_modules"]``) and the
executables compiled during the compiled calls (``debug.stats()``): a new
length in a warm bucket compiles nothing.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
import torch_tpu.compile as tpu_compile

TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def _exact_eager():
    """Eager ops around the compiled calls run exact shapes, so that the
    executables counted are the graphs' own."""
    before = torch_tpu._C._dynamic_shapes()
    torch_tpu.dynamic.set_mode("0")
    yield
    torch_tpu.dynamic.set_mode(before)


def _compiles() -> int:
    s = torch_tpu.debug.stats()
    return s["compiles"] + s.get("disk_hits", 0)


def _modules() -> tuple[int, int]:
    s = tpu_compile.stats()
    return s["bucket_modules"], s["exact_shape_modules"]


def _check(f, make, lengths, expect_new_module, *, tol=TOL, prepare=None, **compile_kw):
    """Calls torch.compile(f) on make(n)'s tensors for each n: results equal
    f on the CPU; `expect_new_module[i]`: whether length i builds a module
    (a new bucket), else nothing compiles during the call (None: a static
    graph's compile, Dynamo's first one without dynamic=True)."""
    cf = torch.compile(f, backend="tpu", **compile_kw)
    for n, new in zip(lengths, expect_new_module):
        cpu = make(n)
        dev = [t.to("tpu") for t in cpu]
        if prepare is not None:
            prepare(dev)
        before_mod, before_c = _modules()[0], _compiles()
        got = cf(*dev)
        after_mod, after_c = _modules()[0], _compiles()
        want = f(*cpu)
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            assert g.shape == w.shape, (n, g.shape, w.shape)
            torch.testing.assert_close(g.cpu(), w, **tol)
        if new is None:
            continue
        assert after_mod - before_mod == int(new), (n, tpu_compile.stats(), tpu_compile.symbolic_fallbacks())
        if not new:
            assert after_c == before_c, (n, torch_tpu.debug.stats()["compiles_by_op"])
    return cf


# Lengths 5, 6, 7 share bucket 8; 9 and 13 bucket 16; 17 bucket 18.
LENGTHS = (5, 6, 7, 9, 13, 17)
NEW = (True, False, False, True, False, True)


def test_elementwise_dynamic_true():
    def f(x):
        return torch.relu(x) * 2 + torch.exp(-x.abs()), torch.where(x > 0.5, x, -x)

    _check(f, lambda n: [torch.randn(n, 8)], LENGTHS, NEW, dynamic=True)
    s = tpu_compile.stats()
    assert s["exact_shape_graphs"] == 0 and s["bucketed_graphs"] == 1, s
    assert s["bucket_modules"] == 3 and s["exact_shape_modules"] == 0, s


def test_reductions_over_the_dynamic_dim_are_masked():
    # Positive inputs: padding counted as anything but the identity would show.
    def f(x):
        return x.sum(0), x.mean(0), x.amax(0), torch.softmax(x, 0), x.mean(), torch.log_softmax(x * 3, 0)

    _check(f, lambda n: [torch.rand(n, 8) + 1], LENGTHS, NEW, dynamic=True)
    assert tpu_compile.stats()["exact_shape_graphs"] == 0


def test_matmul_linear_and_a_contraction_over_the_dynamic_dim():
    torch.manual_seed(0)
    w, b = torch.randn(8, 16), torch.randn(8)

    def f(x, w, b):
        y = F.linear(x, w, b)
        return y, x.t() @ x  # the second contracts the dynamic dim: masked

    _check(f, lambda n: [torch.rand(n, 16) + 1, w, b], LENGTHS, NEW, dynamic=True,
           tol=dict(rtol=1e-4, atol=1e-4))
    assert tpu_compile.stats()["exact_shape_graphs"] == 0


def test_layer_norm():
    torch.manual_seed(0)
    w, b = torch.randn(16), torch.randn(16)

    def f(x, w, b):
        return F.layer_norm(x * 2, (16,), w, b)

    _check(f, lambda n: [torch.randn(2, n, 16), w, b], LENGTHS, NEW, dynamic=True)
    assert tpu_compile.stats()["exact_shape_graphs"] == 0


def _attention(x, wq, wk, wv):
    b, s, _ = x.shape
    def heads(t):
        return t.view(b, s, 4, 8).transpose(1, 2)
    q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
    att = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
    att = att.masked_fill(~causal, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(b, s, 32)


def test_tiny_attention():
    torch.manual_seed(0)
    ws = [torch.randn(32, 32) / 6 for _ in range(3)]
    _check(_attention, lambda n: [torch.randn(1, n, 32)] + ws, LENGTHS, NEW, dynamic=True,
           tol=dict(rtol=1e-4, atol=1e-4))
    assert tpu_compile.stats()["exact_shape_graphs"] == 0, tpu_compile.symbolic_fallbacks()


def test_cat_along_and_across_the_dynamic_dim():
    torch.manual_seed(0)
    tail = torch.randn(3, 8)

    def f(x, tail):
        y = torch.cat([x, tail], 0)  # along the dynamic dim
        z = torch.cat([x, x * 2], 1)  # across it
        return y, y.sum(0), z

    _check(f, lambda n: [torch.randn(n, 8), tail], LENGTHS, NEW, dynamic=True)


def test_index_and_gather_along_static_dims():
    torch.manual_seed(0)
    table = torch.randn(50, 8)

    cols = torch.tensor([0, 3, 5])

    def f(ids, x, table, cols):
        e = F.embedding(ids, table)  # indices with a dynamic dim
        g = torch.gather(x, 1, (ids % 8).unsqueeze(1))  # a static dim gathered
        return e.sum(0), g, torch.index_select(x, 1, cols)

    def static_table(dev):  # gathers from a dynamic dim run exact shapes
        torch._dynamo.mark_static(dev[2])
        torch._dynamo.mark_static(dev[1], 1)

    _check(f, lambda n: [torch.randint(0, 50, (n,)), torch.randn(n, 8), table, cols], LENGTHS, NEW,
           dynamic=True, prepare=static_table)
    assert tpu_compile.stats()["exact_shape_graphs"] == 0, tpu_compile.stats()


def test_automatic_dynamic_after_a_second_length():
    """Without dynamic=...: the first length compiles static; the second
    makes Dynamo trace the graph symbolically: one module per bucket."""
    def f(x):
        return torch.softmax(x * 2, -1).sum(0)

    cf = _check(f, lambda n: [torch.rand(n, 16)], (5, 6, 7, 9, 17), (None, True, False, True, True))
    s = tpu_compile.stats()
    assert s["graphs"] == 2 and s["bucketed_graphs"] == 1 and s["bucket_modules"] == 3, s
    assert cf is not None


def test_mark_dynamic():
    def f(x):
        return (x.exp() - 1).mean(0)

    cf = torch.compile(f, backend="tpu")
    for n, new in ((6, True), (7, False), (5, False), (20, True)):
        x = torch.rand(n, 16)
        d = x.to("tpu")
        torch._dynamo.mark_dynamic(d, 0)
        before = _modules()[0], _compiles()
        got = cf(d)
        if not new:
            assert (_modules()[0], _compiles()) == before
        else:
            assert _modules()[0] == before[0] + 1
        torch.testing.assert_close(got.cpu(), f(x), **TOL)
    assert tpu_compile.stats()["graphs"] == 1


def test_op_the_padder_cannot_handle_runs_exact_shapes():
    """flip reads positions of the dynamic dim (the padding would come
    first): the graph runs one exact-shape module per length, counted."""
    def f(x):
        return torch.flip(x, [0]) * 2

    cf = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6, 5):
        x = torch.randn(n, 8)
        torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x), rtol=0, atol=0)
    s = tpu_compile.stats()
    assert s["exact_shape_graphs"] == 1 and s["exact_shape_modules"] == 2 and s["bucket_modules"] == 0, s
    assert any("flip" in r for r in tpu_compile.symbolic_fallbacks()), tpu_compile.symbolic_fallbacks()


def test_negative_index_into_the_dynamic_dim_runs_exact():
    def f(x):
        return x[-1] + x[:, -1:].sum()

    cf = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 7):
        x = torch.randn(n, 8)
        torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x), **TOL)
    assert tpu_compile.stats()["bucket_modules"] == 0


def test_symbolic_size_as_a_value():
    """x / x.shape[0] uses the length as a value: exact shapes, right answer."""
    def f(x):
        return x.sum(0) / x.shape[0] + x.shape[0]

    cf = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6):
        x = torch.randn(n, 8)
        torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x), **TOL)
    s = tpu_compile.stats()
    assert s["exact_shape_graphs"] == 1 and s["bucket_modules"] == 0, s


def test_training_step_with_ragged_lengths():
    """Forward and backward graphs both run bounded: 2 modules per bucket;
    the loss and every gradient equal the CPU's."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    dev = copy.deepcopy(cpu).to("tpu")

    def loss(m, x):
        return (m(x) ** 2).sum()

    step = torch.compile(lambda x: loss(dev, x), backend="tpu", dynamic=True)
    for n, new in ((5, 2), (6, 0), (7, 0), (9, 2), (12, 0)):
        x = torch.randn(n, 16)
        d = x.to("tpu")
        for m in (cpu, dev):
            m.zero_grad()
        before = _modules()[0], _compiles()
        got = step(d)
        got.backward()
        assert _modules()[0] - before[0] == new, (n, tpu_compile.stats())
        if not new:
            assert _compiles() == before[1], (n, torch_tpu.debug.stats()["compiles_by_op"])
        want = loss(cpu, x)
        want.backward()
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)
        for pc, pd in zip(cpu.parameters(), dev.parameters()):
            torch.testing.assert_close(pd.grad.cpu(), pc.grad, rtol=1e-4, atol=1e-4)
    assert tpu_compile.stats()["exact_shape_graphs"] == 0, tpu_compile.symbolic_fallbacks()



def test_static_cache_update_in_place():
    """A static cache written at a dynamic number of positions (StaticCache's
    index_copy_): the cache is updated in place (donated), the padded rows of
    the update are dropped, one module per bucket."""
    torch.manual_seed(0)
    cf = torch.compile(lambda cache, pos, k: cache.index_copy_(0, pos, k * 2).sum(0), backend="tpu",
                       dynamic=True)
    cache_cpu = torch.zeros(40, 8)
    cache = cache_cpu.to("tpu")
    torch._dynamo.mark_static(cache)
    start = 0
    for n, new in ((5, True), (6, False), (7, False), (9, True), (12, False)):
        pos, k = torch.arange(start, start + n), torch.randn(n, 8)
        start = (start + n) % 20
        d_pos, d_k = pos.to("tpu"), k.to("tpu")
        torch._dynamo.mark_static(d_k, 1)
        before = _modules()[0], _compiles(), tpu_compile.stats()["inputs_donated"]
        got = cf(cache, d_pos, d_k)
        assert _modules()[0] - before[0] == int(new), (n, tpu_compile.stats(), tpu_compile.symbolic_fallbacks())
        if not new:
            assert _compiles() == before[1], (n, torch_tpu.debug.stats()["compiles_by_op"])
        assert tpu_compile.stats()["inputs_donated"] == before[2] + 1
        want = cache_cpu.index_copy_(0, pos, k * 2).sum(0)
        torch.testing.assert_close(got.cpu(), want, **TOL)
        torch.testing.assert_close(cache.cpu(), cache_cpu, rtol=0, atol=0)
    assert tpu_compile.stats()["exact_shape_graphs"] == 0, tpu_compile.symbolic_fallbacks()


def test_cache_with_a_dynamic_batch_updated_in_place():
    """A decode step writing one position of a KV cache whose batch and
    length are symbols (a StaticCache made per generate() call): the cache
    takes its new value padded at its bound (no exact-shape fallback), later
    steps read it as it is, and every value equals the CPU's."""
    torch.manual_seed(0)

    def step(cache, pos, k):
        cache.index_copy_(2, pos, k)
        return (cache * 2).sum(2)

    cf = torch.compile(step, backend="tpu", dynamic=True)
    # Buckets 8, 8, 8 (a small batch reuses a warm small bucket, as in eager), 16.
    for b, new in ((5, True), (6, False), (3, False), (9, True)):
        cache_cpu = torch.zeros(b, 2, 20, 4)
        cache = cache_cpu.to("tpu")
        for position in (3, 4, 7):
            pos, k = torch.tensor([position]), torch.randn(b, 2, 1, 4)
            d_k = k.to("tpu")
            for t in (cache, d_k):
                torch._dynamo.mark_static(t, 1)
                torch._dynamo.mark_static(t, 3)
            before = _modules()[0], _compiles(), tpu_compile.stats()["inputs_donated"]
            got = cf(cache, pos.to("tpu"), d_k)
            built = _modules()[0] - before[0]
            assert built == int(new and position == 3), (b, position, tpu_compile.symbolic_fallbacks())
            if not built:
                assert _compiles() == before[1], (b, position, torch_tpu.debug.stats()["compiles_by_op"])
            assert tpu_compile.stats()["inputs_donated"] == before[2] + 1
            torch.testing.assert_close(got.cpu(), step(cache_cpu, pos, k), **TOL)
            torch.testing.assert_close(cache.cpu(), cache_cpu, rtol=0, atol=0)
        assert cache.untyped_storage().nbytes() == cache_cpu.untyped_storage().nbytes()
    assert tpu_compile.stats()["exact_shape_graphs"] == 0, tpu_compile.symbolic_fallbacks()


def test_cpu_scalar_of_a_symbolic_size_compiles_per_shape():
    """CPU scalar arithmetic on a symbolic size (math.sqrt of a dynamic dim)
    cannot be bounded: the symbolic graph builds one exact-shape module per
    concrete size (the 0-d CPU value is computed in the module), and a size
    seen before reuses its module."""
    def f(x):
        return torch.softmax(x / math.sqrt(x.shape[-1] // 2), -1)

    cf = torch.compile(f, backend="tpu", dynamic=True)
    for n in (6, 7, 6):
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x), **TOL)
    s = tpu_compile.stats()
    assert (s["fallback_graphs"], s["graphs"], s["bucket_modules"], s["exact_shape_modules"]) == (0, 1, 0, 2), s


def test_layer_norm_over_a_padded_hidden_dim_runs_exact():
    """dynamic=True makes the normalized dim symbolic too: a hidden size of 12
    (bucket 16) would count 16 elements: exact shapes, CPU's results."""
    def f(x):
        return F.layer_norm(x, (x.shape[-1],))

    cf = torch.compile(f, backend="tpu", dynamic=True)
    for n, h in ((5, 12), (6, 12), (5, 10)):
        x = torch.randn(n, h) * 3 + 1
        torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x), **TOL)
    assert tpu_compile.stats()["bucket_modules"] == 0, tpu_compile.symbolic_fallbacks()


@pytest.mark.parametrize("width, new", [
    (16, (True, True, False, False)),      # 64-byte rows: 4, then 8 for 5, 6, 7
    (131072, (True, True, False, True)),   # 512 KiB rows: 4, then 6 for 5 and 6; 8 for 7
])
def test_a_small_batch_pads_past_a_quarter_only_while_it_costs_little(width, new):
    """A small symbol takes its coarse bucket (4, 8, 16) or a warm larger one
    while that adds at most 1 MiB to each tensor past 1.25x, as strict eager
    does (TORCH_TPU_PADDING_SLACK_BYTES); rows of 512 KiB take fine buckets:
    batch 5 runs at 6, not at 8 (3 more rows, 1.5 MiB)."""
    def f(x):
        return (x * 2.0).sum(-1)

    _check(f, lambda b: [torch.randn(b, width)], (4, 5, 6, 7), new, dynamic=True)
