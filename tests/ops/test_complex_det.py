"""complex64 det / slogdet / logdet on tpu against CPU.

The LU factorization of a complex matrix is not native yet: it is the one op
that runs on the CPU fallback (linalg_lu_factor_ex); the diagonal products,
sgn, abs and log around it are native. Before, these ops raised
"Expected a floating point tensor".
"""
from __future__ import annotations

import torch

import torch_tpu


def _crandn(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.complex64, generator=g)


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def _new_fallbacks(before: dict) -> set:
    return {k for k, v in _fallbacks().items() if v != before.get(k, 0)}


def test_complex_det_slogdet_logdet_match_cpu() -> None:
    a = _crandn(2, 4, 4)
    nc = _crandn(3, 3, seed=1).mT  # not contiguous: ATen factors A itself
    t, tnc = a.to("tpu"), nc.to("tpu")
    before = _fallbacks()
    got = {
        "det": torch.linalg.det(t),
        "det_nc": torch.linalg.det(tnc),
        "slogdet": torch.linalg.slogdet(t),
        "logdet": torch.logdet(t),
    }
    assert _new_fallbacks(before) <= {"linalg_lu_factor_ex"}
    ref = {
        "det": torch.linalg.det(a),
        "det_nc": torch.linalg.det(nc),
        "slogdet": torch.linalg.slogdet(a),
        "logdet": torch.logdet(a),
    }
    for name in ref:
        gs = got[name] if isinstance(got[name], tuple) else (got[name],)
        rs = ref[name] if isinstance(ref[name], tuple) else (ref[name],)
        for g, r in zip(gs, rs):
            assert g.device.type == "tpu" and g.dtype == r.dtype, (name, g.dtype, r.dtype)
            torch.testing.assert_close(g.cpu(), r, rtol=1e-4, atol=1e-4)
