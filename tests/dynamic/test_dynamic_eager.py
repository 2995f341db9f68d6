"""Bounded dynamic shapes in strict eager (csrc/aten/dynamic.cpp).

For each op family of the first slice: results on the bounded-dynamic
executables equal CPU, and the compile counts drop (sizes 9, 10, 12, 15 of
one op signature: one static executable for the first size, one dynamic one
for the 16-bucket that serves the others). Every test uses its own shapes (a
column count no other test uses) so that signatures do not share state.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import debug, dynamic

SIZES = (9, 10, 12, 15)  # all inside the bucket 16


@pytest.fixture(autouse=True)
def auto_mode():
    dynamic.forget_sizes()
    with dynamic.dynamic_shapes("auto"):
        yield


def run_sizes(fn, make, sizes=SIZES, atol=1e-5, rtol=1.3e-6):
    """Runs fn on tpu and CPU for each size; returns the stats of the tpu runs."""
    debug.reset_stats()
    for n in sizes:
        args = make(n)
        expected = fn(*args)
        got = fn(*[a.to("tpu") for a in args]).cpu()
        assert got.shape == expected.shape and got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    s = debug.stats()
    assert s["fallbacks"] == {}, s["fallbacks"]
    return s


def assert_one_bucket(s, dynamic_hits=2):
    # First size: static; second: the 16-bucket's executable; the rest hit it.
    assert s["compiles"] == 2, s
    assert s["dynamic_executables"] == 1, s
    assert s["dynamic_hits"] == dynamic_hits, s
    assert s["dynamic_exact_fallbacks"] == 0, s


@pytest.mark.parametrize("fn", [torch.exp, torch.tanh, torch.relu, F.gelu, F.silu, torch.sigmoid])
def test_unary(fn):
    assert_one_bucket(run_sizes(fn, lambda n: (torch.randn(n, 21),)))


@pytest.mark.parametrize("op", ["add", "mul", "sub", "div", "maximum"])
def test_binary_same_shape(op):
    f = getattr(torch, op)
    assert_one_bucket(run_sizes(f, lambda n: (torch.randn(n, 22), torch.rand(n, 22) + 0.5)))


def test_binary_broadcast_and_scalar():
    bias = torch.randn(1, 23)
    s = run_sizes(lambda x, b: (x + b) * 2.5, lambda n: (torch.randn(n, 23), bias))
    # add.Tensor and mul.Tensor: each one static and one dynamic executable.
    assert s["compiles"] == 4 and s["dynamic_executables"] == 2 and s["dynamic_hits"] == 4, s


def test_where_and_compare():
    s = run_sizes(lambda x, y: torch.where(x > 0, x, y), lambda n: (torch.randn(37, n), torch.randn(37, n)))
    assert s["compiles"] == 4 and s["dynamic_executables"] == 2 and s["dynamic_hits"] == 4, s


@pytest.mark.parametrize("invert", [False, True])
def test_isin_on_a_dynamic_sequence(invert):
    # generate()'s stopping check: isin(tokens [b, n], eos ids) per new length.
    stop = torch.tensor([3, 7, 11])
    f = lambda x, t: torch.isin(x, t, invert=invert)  # noqa: E731
    assert_one_bucket(run_sizes(f, lambda n: (torch.randint(0, 13, (2 + invert, n)), stop)))
    cols = 3 + invert  # each parametrization its own signature
    s = run_sizes(lambda x: torch.isin(x, 5, invert=invert), lambda n: (torch.randint(0, 9, (n, cols)),))
    assert_one_bucket(s)  # Tensor_Scalar


@pytest.mark.parametrize("scale", [False, True])
def test_embedding_backward_on_a_dynamic_sequence(scale):
    # The gradient of a [b, n] lookup, scattered into the exact [20, h] table:
    # the padding's rows add nothing (padding_idx rows and per-index counts too).
    def grad(idx, w, g):
        w = w.detach().requires_grad_()
        F.embedding(idx, w, padding_idx=1, scale_grad_by_freq=scale).backward(g)
        return w.grad

    cols = 5 + scale  # each parametrization its own signature
    s = run_sizes(grad, lambda n: (torch.randint(0, 20, (2, n)), torch.randn(20, cols), torch.randn(2, n, cols)))
    assert s["compiles_by_op"]["embedding_dense_backward"] == 2, s["compiles_by_op"]
    assert s["dynamic_compiles_by_op"]["embedding_dense_backward"] == 1, s


@pytest.mark.parametrize("dim", [0, 1])
def test_sum_mean_amax_along_the_dynamic_dim_and_the_other(dim):
    x_of = lambda n: (torch.randn(n, 24) - 3,)  # noqa: E731
    for f in (lambda x: x.sum(dim), lambda x: x.mean(dim), lambda x: x.amax(dim),
              lambda x: x.mean(dim, keepdim=True)):
        assert_one_bucket(run_sizes(f, x_of))


def test_full_reductions():
    assert_one_bucket(run_sizes(lambda x: x.sum(), lambda n: (torch.randn(n, 25),)))
    assert_one_bucket(run_sizes(lambda x: x.mean(), lambda n: (torch.randn(n, 25),)))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_and_log_softmax(dim):
    make = lambda n: (torch.randn(2, n, 26) * 3,)  # noqa: E731
    assert_one_bucket(run_sizes(lambda x: torch.softmax(x, dim), make))
    assert_one_bucket(run_sizes(lambda x: torch.log_softmax(x, dim), make))


def test_linear_with_dynamic_batch():
    w, b = torch.randn(7, 27), torch.randn(7)
    assert_one_bucket(run_sizes(lambda x, w, b: F.linear(x, w, b), lambda n: (torch.randn(n, 27), w, b)))


def test_matmul_with_dynamic_contraction():
    assert_one_bucket(run_sizes(lambda a, b: a @ b, lambda n: (torch.randn(38, n), torch.randn(n, 28))))


def test_bmm_with_dynamic_rows():
    y = torch.randn(2, 29, 4)
    assert_one_bucket(run_sizes(torch.bmm, lambda n: (torch.randn(2, n, 29), y)))


def test_past_the_bound_compiles_the_next_bucket():
    s = run_sizes(torch.exp, lambda n: (torch.randn(n, 30),), sizes=(5, 6, 17, 18, 7))
    # 5: static; 6: bucket 8; 17, 18: bucket 18; 7: hits bucket 8.
    assert s["compiles"] == 3 and s["dynamic_executables"] == 2 and s["dynamic_hits"] == 2, s


def test_a_small_size_pads_to_a_small_bucket():
    # 2: static; 3: bucket 4 (a batch of 3 holds 1.33x its bytes, not 16/3).
    s = run_sizes(torch.exp, lambda n: (torch.randn(n, 61),), sizes=(2, 3))
    assert s["compiles"] == 2 and s["dynamic_executables"] == 1, s
    y = torch.exp(torch.randn(3, 61).to("tpu"))
    assert torch_tpu._C._padded_shape(y) == [4, 61]


def test_small_sizes_reuse_a_warm_larger_small_bucket():
    # 4: static; 5: bucket 8; 3 (bucket 4 never compiled), 6, 7: the 8-bucket's executable.
    s = run_sizes(torch.exp, lambda n: (torch.randn(n, 62),), sizes=(4, 5, 3, 6, 7))
    assert s["compiles"] == 2 and s["dynamic_executables"] == 1 and s["dynamic_hits"] == 3, s
    y = torch.exp(torch.randn(3, 62).to("tpu"))
    assert torch_tpu._C._padded_shape(y) == [8, 62]
    # Past the small buckets the grid is fine again: 17 compiles bucket 18.
    s = run_sizes(torch.exp, lambda n: (torch.randn(n, 62),), sizes=(17,))
    assert s["compiles"] == 1 and s["dynamic_executables"] == 1, s


def test_the_first_size_keeps_its_static_executable():
    s = run_sizes(torch.exp, lambda n: (torch.randn(n, 31),), sizes=(5, 6, 5, 5))
    assert s["compiles"] == 2 and s["dynamic_executables"] == 1 and s["dynamic_hits"] == 0, s


def test_exact_mode_compiles_per_shape():
    with dynamic.dynamic_shapes("0"):
        s = run_sizes(torch.exp, lambda n: (torch.randn(n, 32),))
    assert s["compiles"] == 4 and s["dynamic_executables"] == 0, s


def test_mode_one_is_dynamic_from_the_first_call():
    with dynamic.dynamic_shapes("1"):
        s = run_sizes(torch.exp, lambda n: (torch.randn(n, 33),))
    # 33 is dynamic too (bucket 36); one executable for every size.
    assert s["compiles"] == 1 and s["dynamic_executables"] == 1 and s["dynamic_hits"] == 3, s


def test_mode_one_linear_whose_weight_stays_static():
    # In mode 1 the input's contraction dim (31) pads to 36 but the weight, a parameter,
    # stays 31: addmm's Python meta kernel refuses the bucket's sizes (python_error), so
    # the call runs exact instead of raising.
    torch.manual_seed(4)
    lin = torch.nn.Linear(31, 24)
    dev = torch.nn.Linear(31, 24).to("tpu")
    dev.load_state_dict(lin.state_dict())
    with dynamic.dynamic_shapes("1"):
        for n in (5, 6):
            x = torch.randn(n, 31)
            torch.testing.assert_close(dev(x.to("tpu")).detach().cpu(), lin(x).detach(), rtol=1e-5, atol=1e-5)


def test_storages_and_views_keep_pytorch_semantics():
    debug.reset_stats()
    for n in (5, 6, 7):
        x = torch.randn(n, 34)
        y = torch.exp(x.to("tpu"))
        assert y.untyped_storage().nbytes() == n * 34 * 4
        assert y.is_contiguous() and y.stride() == (34, 1)
        v = y[1:, 3]  # a view of a result of a dynamic executable
        torch.testing.assert_close(v.cpu(), torch.exp(x)[1:, 3])
        y.add_(1)  # in place on a dynamic result: a whole-storage write, dynamic too
        torch.testing.assert_close(y.cpu(), torch.exp(x) + 1)
        assert y.untyped_storage().nbytes() == n * 34 * 4
    # exp, add_, and the transfer of the view y[1:, 3] (its window, at bucket 8 from
    # row 1, reads to the buffer's end and zeros after), each once.
    assert debug.stats()["dynamic_executables"] == 3


def test_bad_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="mode must be"):
        dynamic.set_mode("sometimes")


def test_compiles_by_op_names_what_recompiles():
    s = run_sizes(lambda x: torch.exp(x) + x, lambda n: (torch.randn(n, 35),), sizes=(5, 6, 7))
    # exp and add.Tensor: one static and one dynamic executable each.
    assert s["compiles_by_op"] == {"exp": 2, "add.Tensor": 2}, s["compiles_by_op"]
    with dynamic.dynamic_shapes("0"):
        s = run_sizes(torch.exp, lambda n: (torch.randn(n, 36),), sizes=(5, 6, 7))
    assert s["compiles_by_op"] == {"exp": 3}, s["compiles_by_op"]


@pytest.mark.parametrize("mode", ["auto", "1"])
def test_index_copy_of_padded_rows_into_an_exact_cache(mode):
    # A static KV cache's update: source rows and positions padded (results of
    # dynamic ops), the cache exact; the padding rows must not be written.
    torch.manual_seed(0)
    cache = torch.randn(2, 2, 40, 4)
    dev = cache.to("tpu")
    with dynamic.dynamic_shapes(mode):
        for i, s in enumerate((5, 6, 7, 3, 9, 12)):
            src = torch.randn(2, 2, s, 4)
            debug.reset_stats()
            cache.index_copy_(2, torch.arange(s) * 3 + 1, src * 2)
            pos, rows = torch.arange(s, device="tpu") * 3 + 1, src.to("tpu") * 2
            dev.index_copy_(2, pos, rows)
            torch.testing.assert_close(dev.cpu(), cache, rtol=0, atol=0)
            if mode == "auto" and s in (7, 3, 12):  # inside the warm buckets 8 and 16
                assert torch_tpu._C._padded_shape(rows) != []
                s_ = debug.stats()
                assert s_["dynamic_compiles_by_op"].get("index_copy_", 0) == 0, s_
                assert "index_copy_" not in s_["compiles_by_op"], s_


def test_index_copy_checks_the_destinations_real_size():
    # In mode 1 the destination's dim 2 (10) runs at its bucket 16: an index
    # of 10 lands in the padding, and must raise as it does on exact shapes.
    dest = torch.zeros(1, 2, 10, 4, device="tpu")
    src = torch.ones(1, 2, 2, 4, device="tpu")
    with dynamic.dynamic_shapes("1"):
        dest.index_copy_(2, torch.tensor([8, 9], device="tpu"), src)
        assert dest[0, 0, 8:].sum().item() == 8.0
        with pytest.raises(IndexError, match="index out of range for dimension 2"):
            dest.index_copy_(2, torch.tensor([9, 10], device="tpu"), src)
            torch.tpu.synchronize()


@pytest.mark.parametrize("name", ["relu_", "exp_", "sigmoid_", "tanh_"])
def test_in_place_forms_of_a_dynamic_rule_run_dynamic(name):
    # The rule table marks relu, exp, ... dynamic (RuleEntry::Dynamic): their
    # in-place forms on whole storages run bounded too, not just add_ & co.
    def fn(x):
        y = x * 1.0  # a storage of its own
        getattr(y, name)()
        return y

    s = run_sizes(fn, lambda n: (torch.randn(n, 63),))
    # The in-place op: its first size static, then one 16-bucket executable for the others.
    assert s["compiles_by_op"].get(name) == 2, s["compiles_by_op"]
    assert s["dynamic_exact_fallbacks"] == 0 and s["dynamic_hits"] >= 2, s


def test_dynamic_rules_are_stated_by_the_rule_table():
    rules = set(dynamic.rules())
    for name in ("add.Tensor", "exp", "sum.dim_IntList", "mm", "native_layer_norm",
                 "_scaled_dot_product_efficient_attention", "index_copy", "zero", "copy_convert",
                 "_unsafe_index.Tensor", "_index_put_impl", "convolution", "convolution_backward",
                 "max_pool2d_with_indices", "native_batch_norm", "native_group_norm", "upsample_nearest2d",
                 "upsample_bilinear2d_backward", "mse_loss", "mse_loss_backward", "native_dropout",
                 "bernoulli_.float", "uniform_", "multinomial",  # random draws at their real sizes
                 "scatter.src", "scatter_add", "gather", "log_normal_", "normal.Tensor_Tensor",
                 "reflection_pad2d", "replication_pad1d_backward", "scatter_reduce.two", "index_select"):
        assert name in rules, name
    native = set(debug.native_ops())
    for name in ("linspace.out", "randperm.generator_out", "nansum"):  # native rules at exact shapes
        assert name in native and name not in rules, name
    assert set(rules) <= native


def test_bucket_is_strict_eagers_padding():
    assert [dynamic.bucket(n) for n in (0, 1, 2, 3, 5, 9, 16, 17, 31, 33, 100)] == [
        0, 1, 4, 4, 8, 16, 16, 18, 32, 36, 104]
    for n in (17, 50, 300, 5000):  # above 16: under 12.5% padding
        assert n <= dynamic.bucket(n) < n * 1.125
    with pytest.raises(ValueError, match="size is >= 0"):
        dynamic.bucket(-1)
    with pytest.raises(TypeError, match="int size"):
        dynamic.bucket(3.5)


def last_token_logits(logits, lengths):
    """A sequence classifier's pooling: row b's logits at its last real token
    (_unsafe_index forward, index_put with accumulate backward)."""
    return logits[torch.arange(logits.shape[0], device=logits.device), lengths]


def test_integer_indexing_and_its_backward_run_dynamic():
    torch.manual_seed(0)
    w = torch.randn(7)

    def step(x, w, lengths):
        w = w.detach().requires_grad_()  # a parameter: static, as in Dynamo
        logits = (x * w).tanh()  # [b, s, 7], padded in s on tpu
        out = last_token_logits(logits, lengths)
        out.square().sum().backward()  # index_put (accumulate) into the zeros of logits' gradient
        return out.detach(), w.grad

    for s in (11, 13, 14, 9, 16):
        x = torch.randn(3, s, 7)
        lengths = torch.tensor([s - 1, 0, -2])  # a negative index wraps by the real length, not the bucket
        debug.reset_stats()
        got = step(x.to("tpu"), w.to("tpu"), lengths.to("tpu"))
        st = debug.stats()
        for g, e in zip(got, step(x, w, lengths)):
            torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-5)
        if s in (14, 9, 16):  # inside the 16-bucket, warm
            assert st["compiles"] == 0, (s, st["compiles_by_op"], st["exact_reasons"])


def test_index_lists_with_none_run_dynamic():
    # x[:, idx] and x[..., idx2d]: the None entries take whole dims (the
    # dynamic sequence passes through, or is indexed with a negative index
    # wrapping by its real length); forward and backward equal CPU, and a new
    # length in a warm bucket compiles nothing.
    torch.manual_seed(1)
    w = torch.randn(8)
    cols, grid = torch.tensor([1, 7]), torch.tensor([[0, 3], [5, 6]])

    def step(x, w, rows):
        w = w.detach().requires_grad_()
        h = (x * w).tanh()  # [b, s, 8], padded in s on tpu
        outs = (h[:, rows], h[:, :, cols.to(x.device)], h[..., grid.to(x.device)])
        sum(o.square().sum() for o in outs).backward()
        return tuple(o.detach() for o in outs) + (w.grad,)

    for s in (11, 13, 14, 9, 16):
        x = torch.randn(3, s, 8)
        rows = torch.tensor([0, s - 1, -1, 2])
        debug.reset_stats()
        got = step(x.to("tpu"), w.to("tpu"), rows.to("tpu"))
        st = debug.stats()
        for g, e in zip(got, step(x, w, rows)):
            torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-5)
        if s in (14, 9, 16):
            assert st["compiles"] == 0, (s, st["compiles_by_op"], st["exact_reasons"])


def test_integer_indexing_checks_the_real_size():
    # Mode 1: dim 1 (10) runs at its bucket 16; an index of 10 lands in the
    # padding and must raise as on exact shapes, and -10 wraps to row 0.
    x = torch.arange(40.0).view(4, 10).to("tpu") * 1.0
    rows = torch.arange(4, device="tpu")
    with dynamic.dynamic_shapes("1"):
        got = x[rows, torch.tensor([9, -10, 3, -1], device="tpu")].cpu()
        torch.testing.assert_close(got, torch.tensor([9.0, 10.0, 23.0, 39.0]))
        with pytest.raises(IndexError, match="index out of range for dimension 1"):
            x[rows, torch.tensor([9, 10, 0, 0], device="tpu")].cpu()


def test_row_independent_ops_run_unmasked_and_their_padding_is_never_read():
    # At a new batch size only rows are dynamic: mm's rows, a softmax's and a
    # mean's kept dims run unmasked (RuleEntry independent_dims), computing
    # NaN rows from x / x's padding; the sum over the rows reads the real ones.
    w = torch.randn(6, 5)

    def fn(x, w):
        ones = x / x  # [n, 6]: NaN in the padding rows
        h = torch.softmax(torch.mm(ones * x, w), -1) + x.mean(-1, keepdim=True)  # rows independent
        return torch.stack([h.sum(0), (h * 2).amax(0)])

    s = run_sizes(fn, lambda n: (torch.rand(n, 6) + 0.5, w), sizes=(9, 10, 12, 15, 13))
    assert s["dynamic_hits"] >= 12 and s["dynamic_exact_fallbacks"] == 0, s


def test_elementwise_modules_leave_padding_that_reductions_never_read():
    # Elementwise rules run on the padded buffers as static arrays (no sizes
    # set): x / x puts NaN (0 / 0) in the padding that x's host pad filled
    # with zeros. The sums over the dynamic dim read the real elements only.
    def fn(x):
        ones = x / x
        return torch.stack([ones.sum(1), (ones * x).exp().sum(1)])

    s = run_sizes(fn, lambda n: (torch.rand(3, n, 6) + 0.5,), sizes=(9, 10, 12, 15, 13))
    assert s["dynamic_hits"] >= 9, s
