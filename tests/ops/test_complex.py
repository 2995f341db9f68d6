"""complex64 / complex128 on tpu: storage, transfers, views, arithmetic, math.

Each test compares with PyTorch's CPU result and asserts that no CPU
fallback ran (complex ops that are not native fall back; these must not).
"""
import pytest
import torch

import torch_tpu
from no_fallback import native

CDTYPES = [torch.complex64, torch.complex128]


def crandn(*shape, dtype=torch.complex64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=dtype, generator=g)


def close(tpu, cpu, tol=None):
    tol = tol or (1e-5 if cpu.dtype in (torch.complex64, torch.float32) else 1e-12)
    assert tpu.device.type == "tpu"
    assert tpu.dtype == cpu.dtype, (tpu.dtype, cpu.dtype)
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_transfer_round_trip_is_exact(dtype):
    x = crandn(5, 7, dtype=dtype)
    x[0, 0] = complex(float("inf"), float("nan"))
    with native():
        y = x.to("tpu")
        back = y.cpu()
    assert torch.equal(back.view(torch.float64 if dtype == torch.complex128 else torch.float32)
                       .nan_to_num(0), x.view(back.real.dtype).nan_to_num(0))
    assert y.dtype == dtype and y.element_size() == x.element_size()


@pytest.mark.parametrize("dtype", CDTYPES)
def test_view_as_real_and_complex_share_storage(dtype):
    x = crandn(4, 3, dtype=dtype)
    t = x.to("tpu")
    with native():
        r = torch.view_as_real(t)
        assert r.shape == (4, 3, 2) and r.data_ptr() == t.data_ptr()
        assert r.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        r[1, 2, 1] = 42.0           # writes the imaginary part of t[1, 2]
        t[0, 0] = 3 + 4j            # seen through r
        back = torch.view_as_complex(r)
        back.mul_(2)                # the storage of t and r
    xc = x.clone()
    xc[1, 2] = complex(xc[1, 2].real, 42.0)
    xc[0, 0] = 3 + 4j
    xc *= 2
    close(t, xc)
    close(r, torch.view_as_real(xc))
    assert torch.view_as_real(t).stride() == torch.view_as_real(x).stride()


def test_real_imag_are_views_and_assignable():
    x = crandn(6)
    t = x.to("tpu")
    with native():
        re, im = t.real, t.imag
        assert re.data_ptr() == t.data_ptr()
        close(re, x.real)
        close(im, x.imag)
        t.imag.zero_()
        t.real.add_(1)
    close(t, torch.complex(x.real + 1, torch.zeros(6)))


def test_printing_matches_cpu():
    x = torch.tensor([1 + 2j, -0.5j, 3.25 + 0j])
    assert repr(x.to("tpu")).replace(", device='tpu:0'", "") == repr(x)


@pytest.mark.parametrize("op,dtype", [("add", torch.complex64), ("sub", torch.complex64),
                                      ("mul", torch.complex64), ("div", torch.complex64),
                                      ("mul", torch.complex128), ("div", torch.complex128)])
def test_binary_arithmetic(op, dtype):
    a, b = crandn(3, 4, dtype=dtype, seed=1), crandn(3, 4, dtype=dtype, seed=2)
    r = torch.randn(4, dtype=torch.float32)
    f = getattr(torch, op)
    with native():
        close(f(a.to("tpu"), b.to("tpu")), f(a, b))
        close(f(a.to("tpu"), r.to("tpu")), f(a, r))          # complex with real
        close(f(r.to("tpu"), a.to("tpu")), f(r, a))
        close(f(a.to("tpu"), 2.5 - 1j), f(a, 2.5 - 1j))        # complex Python scalar
        close(f(a.to("tpu"), 3), f(a, 3))


def test_complex_scalar_promotes_real_tensor():
    x = torch.randn(5)
    with native():
        y = x.to("tpu") * 1j
        z = (x.to("tpu") + (2 - 3j)).exp()
    close(y, x * 1j)
    close(z, (x + (2 - 3j)).exp())


UNARY = ["exp", "log", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "reciprocal", "neg",
         "sigmoid", "expm1", "log1p", "log10", "log2", "conj_physical", "sgn"]


@pytest.mark.parametrize("op,dtype", [(op, torch.complex64) for op in UNARY] +
                         [(op, torch.complex128) for op in ("exp", "log", "sqrt", "sin", "tanh",
                                                            "reciprocal")])
def test_unary_math(op, dtype):
    x = crandn(4, 5, dtype=dtype, seed=3)
    f = getattr(torch, op)
    tol = 2e-5 if dtype == torch.complex64 else 1e-11
    with native():
        close(f(x.to("tpu")), f(x), tol)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_abs_angle_real_output(dtype):
    x = crandn(7, dtype=dtype, seed=4)
    x[0] = 0
    with native():
        close(x.to("tpu").abs(), x.abs())
        close(x.to("tpu").angle(), x.angle())
    r = torch.tensor([-2.0, 0.0, 3.0, float("nan")])
    with native():
        torch.testing.assert_close(r.to("tpu").angle().cpu(), r.angle(), equal_nan=True)


def test_pow_complex():
    x = crandn(6, seed=5)
    with native():
        close(x.to("tpu") ** 2, x ** 2, 1e-5)
        close(torch.pow(x.to("tpu"), x.to("tpu")), torch.pow(x, x), 1e-4)


def test_conj_lazy_and_physical():
    x = crandn(3, 4, seed=6)
    t = x.to("tpu")
    with native():
        c = t.conj()
        assert c.is_conj()
        close(c.resolve_conj(), x.conj().resolve_conj())
        close(c + 1, x.conj() + 1)
        torch.testing.assert_close(c.cpu().resolve_conj(), x.conj().resolve_conj())
        close(c.imag, x.conj().imag)   # negative-bit view
        close(c.imag * 2, x.conj().imag * 2)
        close(t.mT.conj() @ t, x.mT.conj() @ x)
        close(t.mH @ t, x.mH @ x)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_complex_and_polar_constructors(dtype):
    part = torch.float64 if dtype == torch.complex128 else torch.float32
    re, im = torch.randn(5, dtype=part), torch.randn(5, dtype=part)
    mag = re.abs()
    with native():
        close(torch.complex(re.to("tpu"), im.to("tpu")), torch.complex(re, im))
        close(torch.polar(mag.to("tpu"), im.to("tpu")), torch.polar(mag, im))


@pytest.mark.parametrize("dtype", CDTYPES)
def test_matmul_and_reductions(dtype):
    a, b = crandn(2, 3, 4, dtype=dtype, seed=7), crandn(2, 4, 5, dtype=dtype, seed=8)
    tol = 1e-5 if dtype == torch.complex64 else 1e-12
    with native():
        close(a.to("tpu") @ b.to("tpu"), a @ b, tol)
        close(a[0].to("tpu") @ b[0].to("tpu"), a[0] @ b[0], tol)
        close(a.to("tpu").sum(), a.sum(), tol)
        close(a.to("tpu").sum(dim=1), a.sum(dim=1), tol)
        close(a.to("tpu").mean(dim=(0, 2)), a.mean(dim=(0, 2)), tol)
        close(a.to("tpu").prod(dim=-1), a.prod(dim=-1), 1e-4 if dtype == torch.complex64 else tol)


def test_cat_stack_indexing_where():
    a, b = crandn(2, 3, seed=9), crandn(2, 3, seed=10)
    ta, tb = a.to("tpu"), b.to("tpu")
    idx = torch.tensor([2, 0])
    mask = a.real > 0
    with native():
        close(torch.cat([ta, tb], dim=1), torch.cat([a, b], dim=1))
        close(torch.stack([ta, tb]), torch.stack([a, b]))
        close(ta[:, 1], a[:, 1])
        close(ta[:, idx.to("tpu")], a[:, idx])
        close(ta.index_select(1, idx.to("tpu")), a.index_select(1, idx))
        close(ta.flip(0), a.flip(0))
        close(torch.where(mask.to("tpu"), ta, tb), torch.where(mask, a, b))
        assert torch.equal((ta == ta.clone()).cpu(), torch.ones(2, 3, dtype=torch.bool))
        z = torch.zeros(2, 3, dtype=torch.complex64, device="tpu")
        z[0] = ta[1]
    zc = torch.zeros(2, 3, dtype=torch.complex64)
    zc[0] = a[1]
    close(z, zc)


def test_full_and_fill_with_complex_value():
    with native():
        f = torch.full((3,), 2 - 1j, device="tpu")
        z = torch.zeros(3, dtype=torch.complex64, device="tpu").fill_(0.5j)
    close(f, torch.full((3,), 2 - 1j))
    close(z, torch.full((3,), 0.5j))


def test_backward_through_complex_ops():
    x = torch.randn(4, 6)
    w = crandn(6, 3, seed=11)

    def f(x, w):
        z = torch.view_as_complex(x.reshape(4, 3, 2)) @ w[:3].T.conj()
        return (z.abs() ** 2).sum() + torch.view_as_real(z * 1j).sum()

    xc = x.clone().requires_grad_()
    f(xc, w).backward()
    xt = x.to("tpu").requires_grad_()
    with native():
        f(xt, w.to("tpu")).backward()
    close(xt.grad, xc.grad, 1e-4)


def test_llama_complex_rope_matches_cpu():
    """Meta's Llama reference rotary embedding: polar + view_as_complex."""
    def precompute_freqs_cis(dim, end, theta=10000.0, device=None):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device)[: dim // 2].float() / dim))
        t = torch.arange(end, device=device, dtype=torch.float32)
        freqs = torch.outer(t, freqs)
        return torch.polar(torch.ones_like(freqs), freqs)

    def apply_rotary_emb(xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

    bsz, seq, heads, head_dim = 2, 16, 4, 32
    g = torch.Generator().manual_seed(12)
    xq = torch.randn(bsz, seq, heads, head_dim, generator=g)
    xk = torch.randn(bsz, seq, heads, head_dim, generator=g)
    cq, ck = apply_rotary_emb(xq, xk, precompute_freqs_cis(head_dim, seq))
    xqt, xkt = xq.to("tpu").requires_grad_(), xk.to("tpu").requires_grad_()
    torch_tpu.debug.reset_stats()
    # Exact shapes: under the default "auto", an op another test ran at other
    # sizes runs dynamic, and the first dynamic op of a chain pads its input
    # through the host (README, bounded dynamic shapes); this test is about
    # the reinterpretations.
    with native(), torch_tpu.dynamic.dynamic_shapes("0"):
        freqs = precompute_freqs_cis(head_dim, seq, device="tpu")
        tq, tk = apply_rotary_emb(xqt, xkt, freqs)
        (tq.sum() + (tk * tk).sum()).backward()
    # The complex <-> real reinterpretations stay on the device.
    assert torch_tpu.debug.stats()["transfers_to_host"] == 0
    torch.testing.assert_close(tq.cpu(), cq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tk.cpu(), ck, rtol=1e-5, atol=1e-5)
    xqc, xkc = xq.clone().requires_grad_(), xk.clone().requires_grad_()
    q2, k2 = apply_rotary_emb(xqc, xkc, precompute_freqs_cis(head_dim, seq))
    (q2.sum() + (k2 * k2).sum()).backward()
    torch.testing.assert_close(xqt.grad.cpu(), xqc.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xkt.grad.cpu(), xkc.grad, rtol=1e-5, atol=1e-5)


def test_complex_op_without_native_rule_falls_back_with_cpu_result():
    x = crandn(5, seed=13)
    torch_tpu.debug.reset_stats()
    m = x.reshape(1, 5).expand(5, 5) + torch.eye(5)
    y = torch.linalg.eigvals(m.to("tpu"))  # no complex eig rule: LAPACK's geev on the CPU
    close(y, torch.linalg.eigvals(m), 1e-5)
    assert torch_tpu.debug.stats()["fallbacks"].get("_linalg_eigvals", 0) == 1


def test_nan_inf_norm_cumsum_nonzero():
    x = crandn(3, 4, seed=15)
    x[0, 1] = complex(float("nan"), 1)
    x[1, 2] = complex(2, float("-inf"))
    x[2, 3] = 0
    t = x.to("tpu")
    m = x.real > 0
    with native():
        assert torch.equal(torch.isnan(t).cpu(), torch.isnan(x))
        assert torch.equal(torch.isinf(t).cpu(), torch.isinf(x))
        assert torch.equal(torch.isfinite(t).cpu(), torch.isfinite(x))
    finite = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    ft = finite.to("tpu")
    with native():
        close(torch.linalg.vector_norm(ft), torch.linalg.vector_norm(finite))
        close(torch.linalg.vector_norm(ft, ord=1, dim=1), torch.linalg.vector_norm(finite, 1, 1))
        close(ft.cumsum(1), finite.cumsum(1))
        close(ft.cumprod(0), finite.cumprod(0))
        assert torch.equal(torch.nonzero(ft).cpu(), torch.nonzero(finite))
        close(ft[m.to("tpu")], finite[m])


def test_one_op_reading_a_storage_as_complex_and_real():
    x = crandn(5, seed=16)
    t = x.to("tpu")
    with native():
        close(t * t.real, x * x.real)
        close(t.real - t, x.real - x)
        u = t.clone()
        u.mul_(u.imag)   # written as complex, read as float
    close(u, x * x.imag)
