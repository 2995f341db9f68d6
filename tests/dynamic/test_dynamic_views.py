"""Bounded dynamic shapes through views, joins and attention (dynamic.cpp,
padded_layout.cpp).

A dynamic op reads a view of a padded (or exact) storage when the view is a
permutation of windows of the storage's dims: heads split out of a hidden dim
and transposed, RoPE's halves, a transposed key. A result keeps its input's
memory order (an elementwise op on a transposed view). `cat` grows a KV cache,
attention's matmuls run over it, parameters keep their shapes. Each test warms two
sizes, then checks that new sizes inside the bucket compile nothing and give
CPU's numbers.
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


def rope_attention(x, w, cos, sin, heads):
    """Llama-style: project, split heads (a transposed view), rotate halves,
    causal attention, merge heads (a clone of a transposed view)."""
    b, s, _ = x.shape
    q = F.linear(x, w).view(b, s, heads, -1).transpose(1, 2)
    half = q.shape[-1] // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    q = q * cos[:s] + rotated * sin[:s]
    scores = torch.softmax(q @ q.transpose(-1, -2) / 3.0, dim=-1)
    out = (scores @ q).transpose(1, 2).contiguous()
    return out.view(b, s, -1)


def test_transposed_and_sliced_views_run_dynamic():
    torch.manual_seed(0)
    heads, dim, hidden = 3, 10, 30
    w = torch.randn(heads * dim, hidden) / 5
    cos, sin = torch.randn(48, dim), torch.randn(48, dim)
    dev = [t.to("tpu") for t in (w, cos, sin)]
    for s in (33, 34):  # the first compiles static, the second the 36-bucket
        rope_attention(torch.randn(1, s, hidden).to("tpu"), *dev, heads).cpu()
    for s in (35, 36):
        x = torch.randn(1, s, hidden)
        xt = x.to("tpu")
        debug.reset_stats()
        got = rope_attention(xt, *dev, heads)
        compiles = debug.stats()["compiles"]
        torch.testing.assert_close(got.cpu(), rope_attention(x, w, cos, sin, heads), rtol=1e-5, atol=1e-5)
        st = debug.stats()
        assert compiles == 0, (s, st["compiles_by_op"], st["dynamic_compiles_by_op"], st["exact_reasons"])


def test_a_result_keeps_its_inputs_memory_order():
    x = torch.randn(2, 3, 40, 7)
    for s in (38, 39):
        (torch.randn(2, 3, s, 7).to("tpu").transpose(1, 2) * 2.0).cpu()
    xt = x.to("tpu").transpose(1, 2)
    debug.reset_stats()
    y = xt * 2.0
    assert debug.stats()["compiles"] == 0
    assert y.stride() == (x.transpose(1, 2) * 2.0).stride()  # PyTorch's strides, not contiguous ones
    torch.testing.assert_close(y.cpu(), x.transpose(1, 2) * 2.0, rtol=0, atol=0)
    torch.testing.assert_close((y + 1).cpu(), x.transpose(1, 2) * 2.0 + 1, rtol=0, atol=0)


def attend(q, cache):
    return torch.softmax(q @ cache.transpose(-1, -2) / 2.0, dim=-1) @ cache


def test_a_growing_kv_cache_compiles_nothing_inside_its_bucket():
    torch.manual_seed(1)
    q = torch.randn(1, 2, 1, 6)
    cache_cpu = torch.randn(1, 2, 67, 6)
    cache = cache_cpu.to("tpu")
    qt = q.to("tpu")
    compiles, downloads = [], []
    for _ in range(10):  # lengths 68..77: the 72 bucket (65..72), then 80
        new = torch.randn(1, 2, 1, 6)
        cache_cpu = torch.cat([cache_cpu, new], dim=2)
        new = new.to("tpu")
        debug.reset_stats()
        cache = torch.cat([cache, new], dim=2)
        got = attend(qt, cache)
        st = debug.stats()
        compiles.append(st["compiles"])
        downloads.append(st["transfers_to_host"])  # a host-side re-pad downloads first
        torch.testing.assert_close(got.cpu(), attend(q, cache_cpu), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.cpu(), cache_cpu, rtol=0, atol=0)
    # 68 static; 69 compiles the 72 bucket of cat and attention's ops. A cat keeps
    # its result at its bound's bucket (72 + 1 rows: 80), which its readers
    # take through a window: the first read of such a buffer compiles once
    # (70: cat; 73: attention; 74, 75: the 80 bucket and its 88-row buffer);
    # everything else hits.
    assert compiles[3:5] == [0, 0] and compiles[8:] == [0, 0], str(compiles)
    # The cache stays padded on the device from step to step (each step's
    # result at its bound's bucket): no host round trip.
    assert downloads[2:] == [0] * 8, downloads  # 69: the exact cache padded once
    assert torch_tpu._C._padded_shape(cache) == [1, 2, 88, 6]


def test_parameters_keep_their_shapes():
    torch.manual_seed(3)
    a, b = torch.nn.Linear(12, 26).to("tpu"), torch.nn.Linear(12, 14).to("tpu")
    with torch.no_grad():
        for s in (43, 44, 45):
            x = torch.randn(s, 12).to("tpu")
            a(x).cpu(), b(x).cpu()
    for p in (a.weight, b.weight):  # one signature per weight shape: never padded
        assert torch_tpu._C._padded_shape(p) == []
    x = torch.randn(45, 12)
    torch.testing.assert_close(a(x.to("tpu")).detach().cpu(), F.linear(x, a.weight.detach().cpu(),
                                                                    a.bias.detach().cpu()), rtol=1e-5, atol=1e-5)


def test_report_names_why_an_op_ran_exact():
    x = torch.randn(5, 31).to("tpu")
    for s in (5, 6):
        want = torch.randn(s, 31)
        y = want.to("tpu")
        y[1:-1].add_(1.0)  # an in-place write to part of a dim, not to its end: exact shapes
        want[1:-1].add_(1.0)
        assert torch.equal(y.cpu(), want)
    reasons = debug.stats()["exact_reasons"]
    why = reasons.get("add_.Tensor", reasons.get("add_.Scalar", {}))
    assert why.get("in-place write to part of a storage, a dynamic dim not to its end"), reasons
    assert x.shape == (5, 31)


def test_cat_after_a_static_first_operand():
    # A concatenate whose first operand is static and a later one dynamic once
    # aborted the process in MLIR's type inference (builder.cpp Concatenate).
    for n in (29, 30, 31):
        x = torch.randn(n)
        got = torch.cat([torch.ones(1).to("tpu"), x.to("tpu") * 2.0, torch.zeros(2).to("tpu")])
        torch.testing.assert_close(got.cpu(), torch.cat([torch.ones(1), x * 2.0, torch.zeros(2)]),
                                   rtol=0, atol=0)


def test_grouped_query_heads_are_never_padded():
    # q (4 heads) and k (2 heads) share the elementwise signatures of RoPE (mul, add): a
    # head count 2x another starts its own size variant, so only the sequence is padded.
    torch.manual_seed(5)
    for s in (33, 34, 35):
        q, k, c = torch.randn(1, 4, s, 16), torch.randn(1, 2, s, 16), torch.randn(1, 1, s, 16)
        dq, dk, dc = q.to("tpu"), k.to("tpu"), c.to("tpu")
        rq, rk = dq * dc + dq, dk * dc + dk
        if s > 33:  # dynamic from the second length: heads kept, sequence at bucket 36
            assert torch_tpu._C._padded_shape(rq) == [1, 4, 36, 16], torch_tpu._C._padded_shape(rq)
            assert torch_tpu._C._padded_shape(rk) == [1, 2, 36, 16], torch_tpu._C._padded_shape(rk)
        torch.testing.assert_close(rq.cpu(), q * c + q)
        torch.testing.assert_close(rk.cpu(), k * c + k)


@pytest.mark.usefixtures("auto_dynamic_shapes")  # as in a fresh process: the warm-ups below decide
@pytest.mark.parametrize("form", ["scalar", "column", "bias"])
def test_expanded_views_run_dynamic(form):
    # Expanded (stride 0) views: a sum's backward expands its scalar gradient,
    # a [b, s, 1] column or a [h] bias broadcast by expand. The dynamic op
    # reads them broadcast at the bucket, whatever storage they expand.
    torch.manual_seed(0)
    bias = torch.randn(24)

    def f(x):
        y = torch.tanh(x)  # padded in b and s once dynamic
        if form == "scalar":
            e = torch.ones(()).to(x.device).expand_as(y)
        elif form == "column":
            e = y[:, :, :1].expand_as(y)  # a window of a padded storage, expanded
        else:
            e = bias.to(x.device).expand_as(y)
        return y * e

    for b, s in ((4, 12), (3, 14)):
        f(torch.randn(b, s, 24).to("tpu")).cpu()
    for b, s in ((4, 13), (2, 15), (3, 16)):
        x = torch.randn(b, s, 24)
        debug.reset_stats()
        got = f(x.to("tpu"))
        st = debug.stats()
        assert st["compiles"] == 0, ((b, s), st["compiles_by_op"], st["exact_reasons"])
        torch.testing.assert_close(got.cpu(), f(x), rtol=1e-6, atol=1e-6)


def test_exact_op_reads_an_expanded_window_of_a_padded_storage():
    # An op that runs exact shapes (cumprod has no dynamic rule) on an
    # expanded window of a padded storage reads it straight out of the
    # buffer (stride 0 in the buffer too), equal to CPU.
    torch.manual_seed(0)
    for b, s in ((4, 12), (3, 14), (2, 13)):
        x = torch.randn(b, s, 8)
        y = torch.tanh(x.to("tpu"))
        got = torch.cumprod(y[:, :1, :].expand(b, 3, 8), dim=1)
        torch.testing.assert_close(got.cpu(), torch.cumprod(torch.tanh(x)[:, :1, :].expand(b, 3, 8), dim=1),
                                   rtol=1e-6, atol=1e-6)


def mlp(x, w1, w2):
    """A transformer MLP with a residual: each linear runs as mm on the
    [b*s, h] rows, which the next op reads as [b, s, n]."""
    h = F.gelu(F.linear(x, w1))
    y = F.linear(h, w2) + x
    return torch.softmax(y, -1).mean(-1)


@pytest.mark.parametrize("block", ["mlp", "rope_attention"])
def test_rows_of_a_linear_read_split_by_batch(block):
    """mm's result is padded in its rows (b*s as one dim); the next op reads
    it as [b, s, n] (gelu, the residual add) or as heads transposed out of it
    (attention): a reshaped read that gathers the rows at runtime offsets.
    Sizes at the bucket (36) read the same way as the ones below it. (The
    first size, 33, keeps its exact executables: its result is an exact
    storage, which the next op pads and keys once more.)"""
    torch.manual_seed(0)
    hidden = 30
    if block == "mlp":
        weights = (torch.randn(4 * hidden, hidden) / 5, torch.randn(hidden, 4 * hidden) / 10)
        fn = mlp
    else:
        weights = (torch.randn(hidden, hidden) / 5, torch.randn(48, 10), torch.randn(48, 10), 3)
        fn = rope_attention
    dev = [t.to("tpu") if isinstance(t, torch.Tensor) else t for t in weights]
    for s in (33, 34):
        fn(torch.randn(2, s, hidden).to("tpu"), *dev).cpu()
    for b, s in ((2, 35), (2, 36), (2, 34)):
        x = torch.randn(b, s, hidden)
        xt = x.to("tpu")
        debug.reset_stats()
        got = fn(xt, *dev)
        st = debug.stats()
        assert st["compiles"] == 0, (s, st["compiles_by_op"], st["exact_reasons"])
        torch.testing.assert_close(got.cpu(), fn(x, *weights), rtol=1e-5, atol=1e-5)
