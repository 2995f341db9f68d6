"""torch.complex32 (ComplexHalf, x.chalf()) on tpu, compared with CPU.

XLA has no complex type with float16 parts: a chalf storage holds PyTorch's
own bytes (float16 pairs), and ops run on complex64 copies whose results are
rounded back to float16 parts (complex_half.cpp). Conversions and the ops
CPU implements for chalf give CPU's bits; no CPU fallback runs.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import torch_tpu

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def _bits(z: torch.Tensor) -> torch.Tensor:
    """The float16 parts of a chalf tensor, on CPU (chalf has no CPU equal())."""
    return torch.view_as_real(z.cpu()).view(torch.int16)


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.device.type == "tpu"
    if want.dtype == torch.chalf:
        assert torch.equal(_bits(got), _bits(want))
    else:
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


# Values that round differently under truncation, ties to even, overflow to
# infinity, subnormals, signed zero and NaN.
def _awkward(dtype: torch.dtype) -> torch.Tensor:
    re = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 6e-8, -0.0, float("nan"), 0.1, -3.3],
                      dtype=torch.float64)
    im = re.flip(0) * -1.5
    z = torch.complex(re, im)
    return z.to(dtype) if dtype.is_complex else re.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.complex64, torch.complex128, torch.int64])
def test_conversions_to_and_from_chalf_round_like_cpu(dtype: torch.dtype) -> None:
    x = _awkward(dtype) if dtype != torch.int64 else torch.tensor([0, 7, -70000, 2049])
    before = _fallbacks()
    z = x.to("tpu").chalf()
    _assert_same(z, x.chalf())
    # back: chalf -> the source dtype (complex -> real keeps the real part)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Casting complex values to real discards..."
        back, want = z.to(dtype), x.chalf().to(dtype)
    torch.testing.assert_close(back.cpu(), want, rtol=0, atol=0, equal_nan=True)
    assert _fallbacks() == before


def test_transfers_and_storage_semantics() -> None:
    c = torch.randn(3, 4, dtype=torch.complex64).chalf()
    z = c.to("tpu")
    _assert_same(z, c)
    assert z.element_size() == 4 and z.untyped_storage().nbytes() == 12 * 4
    # view_as_real / view_as_complex share the storage, as on CPU
    r = torch.view_as_real(z)
    assert r.dtype == torch.float16 and r.shape == (3, 4, 2) and r.stride() == (8, 2, 1)
    assert r.untyped_storage().data_ptr() == z.untyped_storage().data_ptr()
    r[1, 2, 1] = 5.0  # a write through the real view is seen by the chalf tensor
    c2 = c.clone()
    torch.view_as_real(c2)[1, 2, 1] = 5.0
    _assert_same(z, c2)
    back = torch.view_as_complex(r)
    assert back.dtype == torch.chalf and back.untyped_storage().data_ptr() == z.data_ptr()
    # views: offsets and strides in elements of 4 bytes
    v = z.t()[1:, 2]
    assert v.storage_offset() == c2.t()[1:, 2].storage_offset()
    _assert_same(v.contiguous(), c2.t()[1:, 2].contiguous())
    assert z[2, 3].item() == c2[2, 3].item()
    # a CPU tensor viewed into the middle of its storage keeps its values
    _assert_same(z[1:].to("cpu").to("tpu"), c2[1:])


def test_factories_fills_and_writes_into_views() -> None:
    z = torch.zeros(2, 3, dtype=torch.chalf, device="tpu")
    want = torch.zeros(2, 3, dtype=torch.chalf)
    _assert_same(z, want)
    z[0].fill_(1.5 - 2j)
    want[0].fill_(1.5 - 2j)
    z[:, 1] = torch.tensor([3 + 1j, 0.1j], dtype=torch.complex64, device="tpu")
    want[:, 1] = torch.tensor([3 + 1j, 0.1j], dtype=torch.complex64)
    _assert_same(z, want)
    o = torch.ones(4, dtype=torch.complex32, device="tpu")
    _assert_same(o, torch.ones(4, dtype=torch.complex32))


OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "neg": lambda a, b: -a,
    "conj_physical": lambda a, b: torch.conj_physical(a),
    "conj_clone": lambda a, b: a.conj().clone(),
    "sgn": lambda a, b: a.sgn(),
    "abs": lambda a, b: a.abs(),
    "cat": lambda a, b: torch.cat([a, b]),
    "where": lambda a, b: torch.where(a.real > 0, a, b),
    "index": lambda a, b: a[[0, 2, 4]],
    "eq": lambda a, b: a == b,
    "mixed_f32": lambda a, b: a + torch.arange(6, dtype=torch.float32, device=a.device),
    "mixed_c64": lambda a, b: a * b.to(torch.complex64),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_cpu_implements_for_chalf_match_cpu_natively(name: str) -> None:
    # CPU computes these in complex<float> and rounds each part once: so do we,
    # so the results are CPU's bits (abs: float16, CPU's result dtype).
    torch.manual_seed(0)
    a = torch.randn(6, dtype=torch.complex64).chalf()
    b = torch.randn(6, dtype=torch.complex64).chalf()
    before = _fallbacks()
    got = OPS[name](a.to("tpu"), b.to("tpu"))
    assert _fallbacks() == before
    _assert_same(got, OPS[name](a, b))


def test_in_place_and_out_variants_write_chalf() -> None:
    a = torch.randn(2, 3, dtype=torch.complex64).chalf()
    b = torch.randn(3, dtype=torch.complex64).chalf()
    at, bt = a.to("tpu"), b.to("tpu")
    at[1].mul_(bt)
    a[1].mul_(b)
    _assert_same(at, a)
    out = torch.empty(0, dtype=torch.chalf, device="tpu")
    torch.add(at, bt, out=out)
    _assert_same(out, torch.add(a, b))


def test_op_db_chalf_entry_matches_cpu() -> None:
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if o.name == "chalf")
    for dtype in (torch.float32, torch.bfloat16, torch.complex64):
        for sample in op.sample_inputs("cpu", dtype):
            want = op(sample.input, *sample.args, **sample.kwargs)
            got = op(sample.input.to("tpu"), *sample.args, **sample.kwargs)
            _assert_same(got, want)


def test_a_compiled_graph_with_chalf_runs_eagerly_with_a_warning() -> None:
    # A module has no chalf type either: the graph runs op by op (each op
    # widened), with a warning naming the dtype; the result is CPU's.
    c = torch.randn(3, dtype=torch.complex64).chalf()
    f = torch.compile(lambda t: t * 2 + t, backend="tpu", fullgraph=True)
    with pytest.warns(UserWarning, match=r"ComplexHalf .*complex64"):
        got = f(c.to("tpu"))
    _assert_same(got, c * 2 + c)
