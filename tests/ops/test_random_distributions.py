"""exponential_, cauchy_, geometric_, log_normal_, bernoulli_(Tensor p) and normal with
tensor mean/std (csrc/lowering/random_distributions.cpp): natively, reproducible under
torch.manual_seed, and drawn from the right distribution (two-sample Kolmogorov-Smirnov
against CPU draws, alpha 1e-3; the streams differ from CPU's, as CUDA's do)."""
import pytest
import torch

from no_fallback import native

N = 20000


def _ks(a, e):
    a, e = a.double().flatten().sort().values, e.double().flatten().sort().values
    pts = torch.cat([a, e])
    d = (torch.searchsorted(a, pts, right=True) / a.numel() - torch.searchsorted(e, pts, right=True) / e.numel())
    return d.abs().max().item(), 1.95 * ((a.numel() + e.numel()) / (a.numel() * e.numel())) ** 0.5


DRAWS = {
    "exponential": lambda t: t.exponential_(2.0),
    "cauchy": lambda t: t.cauchy_(1.0, 0.5),
    "geometric": lambda t: t.geometric_(0.3),
    "log_normal": lambda t: t.log_normal_(0.5, 0.4),
    "bernoulli_tensor": lambda t: t.bernoulli_(torch.linspace(0, 1, t.numel(), device=t.device)),
    "normal_tensor_float": lambda t: torch.normal(torch.linspace(-2, 2, t.numel(), device=t.device, dtype=t.dtype), 0.5),
    "normal_tensor_tensor": lambda t: torch.normal(torch.zeros_like(t) + 1, torch.linspace(0.1, 2, t.numel(), dtype=t.dtype,
                                                                                           device=t.device)),
}


@pytest.mark.parametrize("name", list(DRAWS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_distribution_and_seeding(name, dtype):
    draw = DRAWS[name]
    torch.manual_seed(0)
    want = draw(torch.empty(N, dtype=dtype))
    with native():
        torch.manual_seed(1)
        got = draw(torch.empty(N, dtype=dtype, device="tpu")).cpu()
        torch.manual_seed(1)
        again = draw(torch.empty(N, dtype=dtype, device="tpu")).cpu()
        other = draw(torch.empty(N, dtype=dtype, device="tpu")).cpu()
    assert got.dtype == dtype and got.shape == (N,)
    assert torch.equal(got, again), "the same seed gave different draws"
    assert not torch.equal(got, other), "the next draw repeated the previous one"
    d, critical = _ks(got, want)
    assert d <= critical, f"{name}: KS D={d:.4f} > {critical:.4f}"
    if name == "geometric":
        assert got.min() >= 1 and torch.equal(got, got.round())
