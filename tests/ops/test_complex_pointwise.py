"""complex64 pointwise rules and factories on tpu against CPU, natively.

addcdiv, lerp (|w| < 0.5 picks the formula, w complex too), sinc (1 at 0),
linspace / logspace with complex ends, linalg.cross (no conjugation),
scatter_reduce-style scatter(reduce=add/multiply) and addbmm.
"""
from __future__ import annotations

import torch

from no_fallback import native


def _crandn(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.complex(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g))


def _close(got: torch.Tensor, ref: torch.Tensor, tol: float = 2e-5) -> None:
    assert got.device.type == "tpu" and got.dtype == ref.dtype, (got.dtype, ref.dtype)
    torch.testing.assert_close(got.cpu(), ref, rtol=tol, atol=tol)


def test_addcdiv_lerp_sinc() -> None:
    a, b, c = _crandn(5, 4), _crandn(5, 4, seed=1), _crandn(5, 4, seed=2)
    w = torch.complex(torch.linspace(-1, 1.5, 20), torch.linspace(0.4, -0.4, 20)).reshape(5, 4)
    z = torch.cat([_crandn(10, seed=3).flatten(), torch.tensor([0j, 1e-8 + 0j, 2 + 0j, 1j])])
    cases = {
        "addcdiv": lambda t: torch.addcdiv(t[0], t[1], t[2], value=0.5 - 2j),
        "lerp_scalar": lambda t: torch.lerp(t[0], t[1], 0.3),
        "lerp_scalar_big": lambda t: torch.lerp(t[0], t[1], 0.75),
        "lerp_tensor": lambda t: torch.lerp(t[0], t[1], t[3]),
        "sinc": lambda t: torch.sinc(t[4]),
    }
    cpu = (a, b, c, w.to(torch.complex64), z.to(torch.complex64))
    tpu = tuple(v.to("tpu") for v in cpu)
    for name, fn in cases.items():
        with native():
            got = fn(tpu)
        _close(got, fn(cpu))


def test_linspace_logspace_complex_ends() -> None:
    for start, end, steps in [(0, 1 + 2j, 7), (-3 + 1j, 4 - 5j, 10), (2.5, -1.0, 1), (1j, 1j, 4)]:
        kw = dict(dtype=torch.complex64)
        with native():
            lin = torch.linspace(start, end, steps, device="tpu", **kw)
            log = torch.logspace(start, end, steps, base=2.0, device="tpu", **kw)
        _close(lin, torch.linspace(start, end, steps, **kw))
        _close(log, torch.logspace(start, end, steps, base=2.0, **kw), tol=1e-4)


def test_cross_scatter_reduce_addbmm() -> None:
    x, y = _crandn(4, 3), _crandn(4, 3, seed=1)
    src = _crandn(3, 5, seed=2)
    idx = torch.tensor([[0, 1, 2, 0, 1], [2, 2, 0, 1, 0], [1, 0, 1, 2, 2]])
    m, b1, b2 = _crandn(3, 5, seed=3), _crandn(2, 3, 4, seed=4), _crandn(2, 4, 5, seed=5)
    cases = {
        "cross": lambda t: torch.linalg.cross(t["x"], t["y"]),
        "scatter_add": lambda t: torch.scatter(t["m"], 1, t["idx"], t["src"], reduce="add"),
        "scatter_mul": lambda t: torch.scatter(t["m"], 0, t["idx"], t["src"], reduce="multiply"),
        "addbmm": lambda t: torch.addbmm(t["m"], t["b1"], t["b2"], beta=0.5, alpha=1 - 1j),
    }
    cpu = {"x": x, "y": y, "src": src, "idx": idx, "m": m, "b1": b1, "b2": b2}
    tpu = {k: v.to("tpu") for k, v in cpu.items()}
    for name, fn in cases.items():
        with native():
            got = fn(tpu)
        _close(got, fn(cpu), tol=3e-5)
