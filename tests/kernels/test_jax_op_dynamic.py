"""jax_op with bounded dynamic dims (torch_tpu/jax_dynamic.py, jax_bounds.py):
a dim seen at a second size runs on one executable per size bucket, equal to
the exact-shape jax_op and to JAX on the CPU, forward and backward; sizes
inside a warm bucket compile nothing; functions that do not export
symbolically fall back to exact shapes with a reason; Pallas (interpret mode)
and torch.compile still work.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_tpu

jax = pytest.importorskip("jax")  # scripts/install.sh pins jax==0.10.2
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

from torch_tpu.pallas import jax_op  # noqa: E402
from torch_tpu import jax_dynamic  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)


def _attention(q, k, v):  # noqa: ANN001, ANN202
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


@jax_op("jaxdyn_test::attn")
def attn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return _attention(q, k, v)


@jax_op("jaxdyn_test::attn_count")
def attn_count(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return _attention(q, k, v)


@jax_op("jaxdyn_test::prefill")
def prefill(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[b, s, h] rows through a matmul, and a sum over the sequence."""
    y = jnp.tanh(x @ w)
    return y, y.sum(axis=1)


@jax_op("jaxdyn_test::branchy")
def branchy(x: jax.Array) -> jax.Array:
    if x.shape[0] > 20:  # shape-dependent Python control flow: no symbolic export
        return x * 2.0
    return x + 1.0


def _rows_kernel(x_ref, o_ref):  # noqa: ANN001
    o_ref[...] = x_ref[...] * 3.0 - 1.0


@jax_op("jaxdyn_test::pallas_rows")
def pallas_rows(x: jax.Array) -> jax.Array:
    return pl.pallas_call(_rows_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=True)(x)


@jax_op("jaxdyn_test::accumulate", donate_argnums=(0,))
def accumulate(acc: jax.Array, x: jax.Array) -> jax.Array:
    return acc + x * 2.0


def _fresh() -> None:
    torch_tpu.debug.clear_cache()
    torch_tpu.dynamic.forget_sizes()
    torch_tpu.debug.reset_stats()


def _built() -> int:
    """Executables compiled or loaded from the session's disk cache (a module
    another test compiled loads from there)."""
    s = torch_tpu.debug.stats()
    return s["compiles"] + s["disk_hits"]


def _cache(t_len: int, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, 1, 8, generator=g)
    k = torch.randn(1, 4, t_len, 8, generator=g)
    v = torch.randn(1, 4, t_len, 8, generator=g)
    return q, k, v


def _jax_cpu(fn, *arrays):  # noqa: ANN001, ANN202
    cpu = jax.devices("cpu")[0]
    return np.asarray(jax.jit(fn)(*[jax.device_put(a.numpy(), cpu) for a in arrays]))


@pytest.mark.parametrize("lengths", [(5, 6, 9, 12), (16, 17, 19, 30, 33, 40)])
def test_sizes_inside_and_across_buckets_equal_exact_and_jax(lengths: tuple) -> None:
    """Lengths inside the first bucket (16) and across buckets: each result
    equals the exact-shape jax_op (mode 0) and JAX on the CPU."""
    for t_len in lengths:
        q, k, v = _cache(t_len, seed=t_len)
        out = attn(q.to("tpu"), k.to("tpu"), v.to("tpu")).cpu()
        with torch_tpu.dynamic.dynamic_shapes("0"):
            exact = attn(q.to("tpu"), k.to("tpu"), v.to("tpu")).cpu()
        np.testing.assert_allclose(out.numpy(), exact.numpy(), **TOL)
        np.testing.assert_allclose(out.numpy(), _jax_cpu(_attention, q, k, v), **TOL)


def test_warm_bucket_compiles_nothing() -> None:
    """Decode steps 9..16 (one bucket): two exact compiles (the first two
    sizes), one bounded one, then nothing; the next bucket compiles once."""
    _fresh()
    compiles = []
    for t_len in range(9, 19):
        before = _built()
        q, k, v = _cache(t_len)
        attn_count(q.to("tpu"), k.to("tpu"), v.to("tpu")).cpu()
        compiles.append(_built() - before)
    assert compiles[:2] == [1, 1]  # first size exact; second size: the dim turns dynamic (bucket 16)
    assert sum(compiles[2:8]) == 0  # lengths 11..16: the warm bucket
    assert compiles[8] == 1 and compiles[9] == 0  # 17, 18: bucket 18
    s = torch_tpu.debug.stats()
    assert s["dynamic_executables"] == 2
    assert s["dynamic_hits"] == 7


def test_forget_sizes_resets_what_jax_op_saw() -> None:
    """After forget_sizes() the next size of a family runs exact again (its
    first), and the one after it turns the dim dynamic once more."""
    _fresh()
    for t_len in (9, 10, 11):
        q, k, v = _cache(t_len)
        attn_count(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    hits = torch_tpu.debug.stats()["dynamic_hits"]
    torch_tpu.dynamic.forget_sizes()
    q, k, v = _cache(12)
    attn_count(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    assert torch_tpu.debug.stats()["dynamic_hits"] == hits  # ran exact
    q, k, v = _cache(13)
    attn_count(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    assert torch_tpu.debug.stats()["dynamic_hits"] == hits + 1  # the kept bucket-16 executable


def test_mark_dynamic_and_mode_one_run_bounded_from_the_first_call() -> None:
    _fresh()
    q, k, v = _cache(7)
    kt, vt = k.to("tpu"), v.to("tpu")
    torch_tpu.dynamic.mark_dynamic(kt, 2)
    torch_tpu.dynamic.mark_dynamic(vt, 2)
    with torch_tpu.dynamic.dynamic_shapes("0"):
        out = attn_count(q.to("tpu"), kt, vt).cpu()
    assert torch_tpu.debug.stats()["dynamic_executables"] == 1
    np.testing.assert_allclose(out.numpy(), _jax_cpu(_attention, q, k, v), **TOL)
    x, w = torch.randn(2, 11, 6), torch.randn(6, 5)
    before = torch_tpu.debug.stats()
    with torch_tpu.dynamic.dynamic_shapes("1"):
        y, s = prefill(x.to("tpu"), w.to("tpu"))
    after = torch_tpu.debug.stats()
    # Every dim of size > 1 dynamic: XLA pads it (one bounded executable) or
    # refuses (exact shapes, counted with a reason); the result is exact either way.
    assert (after["dynamic_executables"] - before["dynamic_executables"]
            + after["dynamic_exact_fallbacks"] - before["dynamic_exact_fallbacks"]) == 1
    np.testing.assert_allclose(y.cpu().numpy(), torch.tanh(x @ w).numpy(), **TOL)
    np.testing.assert_allclose(s.cpu().numpy(), torch.tanh(x @ w).sum(1).numpy(), rtol=1e-5, atol=1e-4)


def test_dynamic_outputs_forward_and_backward() -> None:
    """A prefill at new sequence lengths: outputs with a dynamic dim (their
    storages padded at the bound) and gradients through jax.vjp, equal to
    PyTorch on the CPU."""
    _fresh()
    w = torch.randn(6, 5)
    for seq in (9, 10, 13, 21):
        x = torch.randn(2, seq, 6)
        xt = x.to("tpu").requires_grad_()
        wt = w.to("tpu").requires_grad_()
        y, s = prefill(xt, wt)
        assert y.shape == (2, seq, 5) and s.shape == (2, 5)
        (y.sum() + (s * s).sum()).backward()
        xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
        yc = torch.tanh(xc @ wc)
        (yc.sum() + (yc.sum(1) ** 2).sum()).backward()
        np.testing.assert_allclose(y.detach().cpu().numpy(), yc.detach().numpy(), **TOL)
        # a strict-eager op reads the padded output storage
        np.testing.assert_allclose((y * 2).detach().cpu().numpy(), (yc * 2).detach().numpy(), **TOL)
        np.testing.assert_allclose(xt.grad.cpu().numpy(), xc.grad.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(wt.grad.cpu().numpy(), wc.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert torch_tpu.debug.stats()["dynamic_executables"] >= 2  # forward and vjp, bounded


def test_attention_backward_through_a_growing_cache() -> None:
    _fresh()
    for t_len in (6, 7, 11):
        q, k, v = _cache(t_len)
        qt, kt, vt = (a.to("tpu").requires_grad_() for a in (q, k, v))
        attn(qt, kt, vt).square().sum().backward()
        qc, kc, vc = (a.clone().requires_grad_() for a in (q, k, v))
        p = torch.softmax(qc @ kc.transpose(-1, -2) / np.sqrt(8), -1)
        (p @ vc).square().sum().backward()
        for got, want in ((qt, qc), (kt, kc), (vt, vc)):
            np.testing.assert_allclose(got.grad.cpu().numpy(), want.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_non_exportable_function_falls_back_with_a_reason() -> None:
    _fresh()
    for n in (8, 9, 24):
        x = torch.randn(n, 3)
        out = branchy(x.to("tpu")).cpu()
        np.testing.assert_allclose(out.numpy(), (x * 2.0 if n > 20 else x + 1.0).numpy(), **TOL)
    reasons = torch_tpu.debug.stats()["exact_reasons"]["jax_op:jaxdyn_test::branchy"]
    assert any("no bounded export" in r for r in reasons)
    assert "jaxdyn_test::branchy" in jax_dynamic.fallbacks()
    assert torch_tpu.debug.stats()["dynamic_exact_fallbacks"] >= 1


def test_pallas_kernel_in_interpret_mode() -> None:
    for n in (8, 12, 13):
        x = torch.randn(n, 16)
        out = pallas_rows(x.to("tpu")).cpu()
        np.testing.assert_allclose(out.numpy(), (x * 3.0 - 1.0).numpy(), **TOL)


def test_donation_with_dynamic_dims() -> None:
    _fresh()
    for n in (8, 9, 12):
        acc = torch.ones(n, 4, device="tpu")
        x = torch.full((n, 4), 0.5, device="tpu")
        out = accumulate(acc, x)
        np.testing.assert_allclose(out.cpu().numpy(), np.full((n, 4), 2.0), **TOL)
        np.testing.assert_allclose(x.cpu().numpy(), np.full((n, 4), 0.5), **TOL)  # not donated


def test_torch_compile_still_runs_jax_op() -> None:
    def f(q, k, v):  # noqa: ANN001, ANN202
        return attn(q, k, v) * 2.0

    compiled = torch.compile(f, backend="tpu", fullgraph=True, dynamic=False)
    for t_len in (5, 6):
        q, k, v = _cache(t_len)
        out = compiled(q.to("tpu"), k.to("tpu"), v.to("tpu")).cpu()
        np.testing.assert_allclose(out.numpy(), 2.0 * _jax_cpu(_attention, q, k, v), **TOL)
