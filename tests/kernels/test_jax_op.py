"""torch_tpu.pallas.jax_op: JAX functions (and Pallas kernels in interpret
mode) as torch ops on tpu: forward and backward equal to JAX on the CPU, in
eager, fused eager and inside torch.compile graphs (one op of the graph),
one compile per shape signature, donation, and clear errors.

JAX is imported once for the module (slow); the file is skipped without it.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_tpu

jax = pytest.importorskip("jax")  # scripts/install.sh pins jax==0.10.2
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

from torch.tpu.pallas import custom_jax_kernel, jax_op  # noqa: E402  (where TorchTPU users import it)

TOL = dict(rtol=1e-5, atol=1e-5)


def _stats() -> dict:
    return torch_tpu.debug.stats()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


@jax_op("jaxop_test::sin_mul")
def sin_mul(x: jax.Array, y: jax.Array, scale: float = 2.0) -> jax.Array:
    return jnp.sin(x) * y * scale


@jax_op("jaxop_test::pair")
def pair(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    h = jnp.tanh(x @ w)
    return h, h.sum(axis=-1)


def _double_plus_one_kernel(x_ref, o_ref):  # noqa: ANN001
    o_ref[...] = x_ref[...] * 2.0 + 1.0


def _double_kernel(g_ref, o_ref):  # noqa: ANN001
    o_ref[...] = g_ref[...] * 2.0


def _rows_call(kernel, x):  # noqa: ANN001, ANN202  (blocks of 8 rows, interpret mode)
    block = pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // 8,), in_specs=[block], out_specs=block,
                          interpret=True)(x)


@jax.custom_vjp
def _affine(x):  # noqa: ANN001, ANN202  (Pallas kernels differentiate through custom_vjp)
    return _rows_call(_double_plus_one_kernel, x)


_affine.defvjp(lambda x: (_affine(x), None), lambda _, g: (_rows_call(_double_kernel, g),))


@jax_op("jaxop_test::pallas_affine")
def pallas_affine(x: jax.Array) -> jax.Array:
    return _affine(x)


@jax_op("jaxop_test::accumulate", donate_argnums=(0,))
def accumulate(acc: jax.Array, x: jax.Array) -> jax.Array:
    return acc + x


def test_forward_backward_equal_jax_on_cpu():
    rng = np.random.default_rng(0)
    xn, yn = rng.standard_normal((4, 6), np.float32), rng.standard_normal((4, 6), np.float32)
    x = torch.tensor(xn, device="tpu", requires_grad=True)
    y = torch.tensor(yn, device="tpu", requires_grad=True)
    out = sin_mul(x, y, 3.0)
    assert out.device.type == "tpu"

    ref, pullback = jax.vjp(lambda a, b: jnp.sin(a) * b * 3.0, xn, yn)
    np.testing.assert_allclose(_np(out), np.asarray(ref), **TOL)
    g = rng.standard_normal((4, 6), np.float32)
    out.backward(torch.tensor(g, device="tpu"))
    gx, gy = pullback(g)
    np.testing.assert_allclose(_np(x.grad), np.asarray(gx), **TOL)
    np.testing.assert_allclose(_np(y.grad), np.asarray(gy), **TOL)


def test_tuple_outputs_views_and_one_compile_per_signature():
    rng = np.random.default_rng(1)
    xn, wn = rng.standard_normal((8, 5), np.float32), rng.standard_normal((5, 3), np.float32)
    x = torch.tensor(xn, device="tpu")
    w_t = torch.tensor(wn.T.copy(), device="tpu").t()  # a non-contiguous view
    before = _stats()["compiles"]
    h, s = pair(x, w_t)
    ref_h = np.tanh(xn @ wn)
    np.testing.assert_allclose(_np(h), ref_h, **TOL)
    np.testing.assert_allclose(_np(s), ref_h.sum(-1), **TOL)
    # New values, uploaded (x + k on the device could run as a bounded-dynamic
    # op after other tests and hand jax_op a padded storage: another module).
    xs = [torch.tensor(xn + k, device="tpu") for k in range(1, 4)]
    after_first, by_op = _stats()["compiles"], _stats()["compiles_by_op"]
    for xk in xs:  # same signature: no new compile
        pair(xk, w_t)
    assert _stats()["compiles"] == after_first, (by_op, _stats()["compiles_by_op"])
    assert after_first > before
    assert _stats()["disk_misses"] > 0  # compiled through the disk tier (written for next time)
    h8, _ = pair(torch.tensor(xn[:4], device="tpu"), w_t)  # a new signature compiles
    np.testing.assert_allclose(_np(h8), ref_h[:4], **TOL)


def test_pallas_kernel_in_interpret_mode_forward_and_backward():
    xn = np.arange(16 * 128, dtype=np.float32).reshape(16, 128) / 100
    x = torch.tensor(xn, device="tpu", requires_grad=True)
    out = pallas_affine(x)
    np.testing.assert_allclose(_np(out), xn * 2 + 1, **TOL)
    out.sum().backward()
    np.testing.assert_allclose(_np(x.grad), np.full_like(xn, 2.0), **TOL)


def test_inside_torch_compile_as_one_op_of_the_graph():
    torch_tpu.compile.reset_stats()
    rng = np.random.default_rng(2)
    xn, yn = rng.standard_normal((4, 6), np.float32), rng.standard_normal((4, 6), np.float32)

    def f(x, y):  # noqa: ANN001, ANN202
        return (sin_mul(x.exp(), y, 0.5) + 1).sum(dim=0)

    x = torch.tensor(xn, device="tpu", requires_grad=True)
    y = torch.tensor(yn, device="tpu")
    compiled = torch.compile(f, backend="tpu", fullgraph=True)
    out = compiled(x, y)
    out.sum().backward()
    st = torch_tpu.compile.stats()
    assert st["fallback_graphs"] == 0 and st["native_graphs"] == st["graphs"] == 2, st

    ref, pullback = jax.vjp(lambda a: (jnp.sin(jnp.exp(a)) * yn * 0.5 + 1).sum(0), xn)
    np.testing.assert_allclose(_np(out), np.asarray(ref), **TOL)
    np.testing.assert_allclose(_np(x.grad), np.asarray(pullback(np.ones(6, np.float32))[0]),
                               rtol=1e-4, atol=1e-5)


def test_fused_eager():
    xn = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    with torch_tpu.fused():
        x = torch.tensor(xn, device="tpu")
        y = x * 2  # recorded, pending when the jax_op reads it
        out = sin_mul(y, x) + 1
    np.testing.assert_allclose(_np(out), np.sin(xn * 2) * xn * 2 + 1, **TOL)


def _fused_step(x, w):  # noqa: ANN001, ANN202  (ops, jax_ops on pending values and views, ops)
    y = x * 2
    h, s = pair(y, w[:, :3])          # a pending input and a view (copied in the chain)
    z = sin_mul(h, h + 1, 0.5)        # a jax_op reading another's output
    return (z.sum(dim=0) + s.mean()).relu(), pallas_affine(y[:8] - 1)


# Sizes other tests of this process showed the dynamic policy would make the
# ops of a fused-execution count dynamic, and a call at a new size of a dynamic
# signature runs alone in fused eager (README: bounded dynamic shapes): such
# tests start from a fresh process's policy.
fresh_dynamic_policy = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


def _executions(fn):  # noqa: ANN001, ANN202
    """fn()'s results and the executions it took, warm (run once before)."""
    fn()
    torch.tpu.synchronize()
    before = _stats()["executions"]
    out = fn()
    torch.tpu.synchronize()
    return out, _stats()["executions"] - before


@fresh_dynamic_policy
def test_fused_eager_jax_ops_join_the_chain():
    """Under fused eager, jax_ops (tuple outputs, Pallas in interpret mode)
    join the chain of the ops around them: one execution for the whole step
    (strict eager: one per op), equal results, the calls still counted."""
    rng = np.random.default_rng(3)
    xn, wn = rng.standard_normal((16, 5), np.float32), rng.standard_normal((5, 4), np.float32)
    x, w = torch.tensor(xn, device="tpu"), torch.tensor(wn, device="tpu")
    strict, strict_execs = _executions(lambda: _fused_step(x, w))
    calls = _stats()["native_ops"]["jax_op"]
    with torch_tpu.fused():
        fused, fused_execs = _executions(lambda: _fused_step(x, w))
    assert _stats()["native_ops"]["jax_op"] - calls == 2 * 3
    assert fused_execs == 1 and strict_execs >= 8, (fused_execs, strict_execs)
    h = np.tanh(xn * 2 @ wn[:, :3])
    ref = np.maximum((np.sin(h) * (h + 1) * 0.5).sum(0) + h.sum(-1).mean(), 0)
    for a, b, r in zip(fused, strict, (ref, (xn[:8] * 2 - 1) * 2 + 1)):
        np.testing.assert_allclose(_np(a), r, **TOL)
        np.testing.assert_allclose(_np(a), _np(b), **TOL)


def test_fused_eager_backward_and_donation():
    """Forward and backward (the vjp op) in one fused chain, equal to JAX;
    a donating jax_op runs alone (its input's buffer is given away) and
    still consumes the input."""
    rng = np.random.default_rng(4)
    xn = rng.standard_normal((4, 6), np.float32)
    with torch_tpu.fused():
        x = torch.tensor(xn, device="tpu", requires_grad=True)
        out = sin_mul(x * 3, x, 2.0)
        out.sum().backward()
        acc = torch.ones(4, 6, device="tpu") * 2  # pending: the chain runs first
        summed = accumulate(acc, out.detach())
    ref, pullback = jax.vjp(lambda a: jnp.sin(a * 3) * a * 2.0, xn)
    np.testing.assert_allclose(_np(out), np.asarray(ref), **TOL)
    np.testing.assert_allclose(_np(x.grad), np.asarray(pullback(np.ones_like(xn))[0]),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_np(summed), np.asarray(ref) + 2, **TOL)
    with pytest.raises(RuntimeError, match="(?i)delet|donat"):
        acc.cpu()


def test_fused_eager_jax_op_inputs_zero_size_shared_and_reinterpreted():
    """Inputs of a recorded jax_op: a zero-size tensor, one tensor passed
    twice, a storage the chain read as int32 before (its bytes reinterpreted)."""
    xn = np.arange(6, dtype=np.float32).reshape(2, 3)
    with torch_tpu.fused():
        a = torch.tensor(xn, device="tpu") * 1
        bits = a.view(torch.int32) + 0            # a's storage read as int32
        empty = sin_mul(torch.zeros(0, 3, device="tpu") + 1, torch.ones(0, 3, device="tpu"))
        twice = sin_mul(a, a, 1.0)                # a read as float32 again
    assert empty.shape == (0, 3)
    assert torch.equal(bits.cpu(), torch.from_numpy(xn.view(np.int32)))
    np.testing.assert_allclose(_np(twice), np.sin(xn) * xn, **TOL)


@fresh_dynamic_policy
def test_fused_eager_jax_ops_alone_when_asked():
    """_C._set_jax_ops_join_fused(False) (what benchmarks compare against):
    each jax_op ends the chain and runs alone, with the same results."""
    rng = np.random.default_rng(5)
    xn, wn = rng.standard_normal((16, 5), np.float32), rng.standard_normal((5, 4), np.float32)
    x, w = torch.tensor(xn, device="tpu"), torch.tensor(wn, device="tpu")
    previous = torch_tpu._C._set_jax_ops_join_fused(False)
    try:
        with torch_tpu.fused():
            alone, alone_execs = _executions(lambda: _fused_step(x, w))
    finally:
        torch_tpu._C._set_jax_ops_join_fused(previous)
    with torch_tpu.fused():
        joined, joined_execs = _executions(lambda: _fused_step(x, w))
    assert joined_execs == 1 and alone_execs >= 4, (joined_execs, alone_execs)
    for a, b in zip(alone, joined):
        np.testing.assert_allclose(_np(a), _np(b), **TOL)


def test_donate_argnums_consumes_the_input():
    acc = torch.ones(4, 8, device="tpu")
    x = torch.full((4, 8), 2.0, device="tpu")
    out = accumulate(acc, x)
    np.testing.assert_allclose(_np(out), np.full((4, 8), 3.0), **TOL)
    np.testing.assert_allclose(_np(x), np.full((4, 8), 2.0), **TOL)  # not donated
    with pytest.raises(RuntimeError, match="(?i)delet|donat"):
        acc.cpu()


def test_custom_jax_kernel_takes_pytrees_and_static_args():
    kernel = custom_jax_kernel(lambda d, n: {"a": d["x"] * n, "b": [d["y"] + 1, d["x"].sum()]},
                               static_argnums=(1,))
    assert torch_tpu.pallas.custom_jax_kernel is custom_jax_kernel
    x = torch.arange(6.0, device="tpu").reshape(2, 3)
    y = torch.ones(3, device="tpu")
    out = kernel({"x": x, "y": y}, 3)
    np.testing.assert_allclose(_np(out["a"]), np.arange(6.0).reshape(2, 3) * 3)
    np.testing.assert_allclose(_np(out["b"][0]), np.full(3, 2.0))
    assert out["b"][1].item() == 15.0


def test_cpu_tensors_run_jax_on_cpu():
    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    torch.testing.assert_close(sin_mul(x, x, 1.0), torch.sin(x) * x)


def test_missing_jax_says_how_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(__import__("sys").modules, "jax", None)  # `import jax` fails
    with pytest.raises(ImportError, match="pip install jax==0.10.2 jaxlib==0.10.2"):
        jax_op("jaxop_test::needs_jax", lambda x: x)


def test_errors():
    with pytest.raises(ValueError, match="namespace::name"):
        jax_op("no_namespace", lambda x: x)
    with pytest.raises(ValueError, match="return"):
        jax_op("jaxop_test::unannotated_return", lambda x: x)

    @jax_op("jaxop_test::not_exportable")
    def bad(x: jax.Array) -> jax.Array:
        return jnp.asarray(np.asarray(x))  # concrete value of a tracer

    with pytest.raises(Exception, match="jaxop_test::not_exportable"):
        bad(torch.ones(3, device="tpu"))
    with pytest.raises(RuntimeError, match="tpu:0|tpu"):
        pair(torch.ones(2, 3, device="tpu"), torch.ones(3, 2))


def test_clear_cache_drops_jax_op_executables():
    x = torch.randn(6, 7, device="tpu")
    want = sin_mul(x, x).cpu()
    torch_tpu.debug.clear_cache()
    torch_tpu.debug.reset_stats()
    got = sin_mul(x, x).cpu()
    s = _stats()
    # The executable is looked up again (compiled, or loaded from the disk
    # cache), not kept by the registered module past clear_cache().
    assert s["compiles"] + s["disk_hits"] >= 1
    torch.testing.assert_close(got, want, rtol=0, atol=0)
