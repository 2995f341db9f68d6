"""complex64 random fills on tpu, natively: normal_ / uniform_ of a complex
tensor fill both parts independently as CPU's view_as_real(self) does
(normal_ with std / sqrt(2) per part). Compared by seeding and distribution,
not values (tpu and CPU generators differ).
"""
from __future__ import annotations

import math

import torch

from no_fallback import native


def test_randn_complex_parts_are_independent_halves_of_the_variance() -> None:
    n = 20000
    with native():
        torch.manual_seed(3)
        z = torch.randn(n, dtype=torch.complex64, device="tpu")
        torch.manual_seed(3)
        again = torch.randn(n, dtype=torch.complex64, device="tpu")
        other = torch.randn(n, dtype=torch.complex64, device="tpu")
    assert z.dtype == torch.complex64 and z.device.type == "tpu"
    z, again, other = z.cpu(), again.cpu(), other.cpu()
    assert torch.equal(z, again) and not torch.equal(z, other)
    re, im = z.real.double(), z.imag.double()
    se = 4 / math.sqrt(n)  # a few standard errors
    assert abs(re.mean()) < se and abs(im.mean()) < se
    assert abs(re.var() - 0.5) < 4 * se and abs(im.var() - 0.5) < 4 * se
    assert abs((z.abs() ** 2).double().mean() - 1.0) < 6 * se
    assert abs(torch.corrcoef(torch.stack([re, im]))[0, 1]) < se
    # the two parts follow the CPU's distribution: KS distance to CPU's parts
    cpu = torch.view_as_real(torch.randn(n, dtype=torch.complex64, generator=torch.Generator().manual_seed(0)))
    for ours, theirs in [(re, cpu[:, 0].double()), (im, cpu[:, 1].double())]:
        grid = torch.linspace(-3, 3, 121, dtype=torch.float64)
        cdf = lambda v: (v[:, None] <= grid).double().mean(0)  # noqa: E731
        assert (cdf(ours) - cdf(theirs)).abs().max() < 0.03


def test_normal_and_uniform_in_place_on_complex() -> None:
    n = 20000
    t = torch.empty(n, dtype=torch.complex64, device="tpu")
    with native():
        t.normal_(2.0, 3.0)
    z = t.cpu()
    se = 4 / math.sqrt(n)
    assert abs(z.real.double().mean() - 2.0) < 3 * se and abs(z.imag.double().mean() - 2.0) < 3 * se
    # per part std = 3 / sqrt(2), as CPU
    assert abs(z.real.double().std() - 3 / math.sqrt(2)) < 0.05
    assert abs(z.imag.double().std() - 3 / math.sqrt(2)) < 0.05
    with native():
        t.uniform_(-1.0, 3.0)
        r = torch.rand(n, dtype=torch.complex64, device="tpu")
    u = torch.view_as_real(t.cpu())
    assert u.min() >= -1.0 and u.max() < 3.0 and abs(u.double().mean() - 1.0) < 0.05
    v = torch.view_as_real(r.cpu())
    assert v.min() >= 0.0 and v.max() < 1.0 and abs(v.double().mean() - 0.5) < 0.02
    assert abs(torch.corrcoef(v.double().T)[0, 1]) < se


def test_consecutive_complex_draws_share_no_values() -> None:
    # each call consumes only the generator counters it advances past
    n = 4096
    torch.manual_seed(0)
    with native():
        draws = [torch.randn(n, dtype=torch.complex64, device="tpu").cpu() for _ in range(2)]
        draws += [torch.rand(n, dtype=torch.complex64, device="tpu").cpu() for _ in range(2)]
    for a, b in (draws[:2], draws[2:]):
        seen = set(torch.view_as_real(a).flatten().tolist())
        shared = sum(v in seen for v in torch.view_as_real(b).flatten().tolist())
        assert shared < 40, shared  # chance coincidences of f32 values only (~8 expected)
