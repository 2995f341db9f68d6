"""torch.special's orthogonal polynomials (csrc/lowering/orthogonal_polynomials.cpp):
natively, equal to CPU for degrees -1..12 (fractional ones truncate), x at +-1, 0 and
inside / outside (-1, 1) (the kernels switch to trigonometric forms for large n)."""
import pytest
import torch

from no_fallback import native

NAMES = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
         "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
         "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
         "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", NAMES)
def test_polynomial_matches_cpu(name):
    fn = getattr(torch.special, name)
    x = torch.tensor([-1.0, 1.0, 0.0, 0.5, -0.3, 0.93, 1.7, -2.2, 0.25, 0.75]).reshape(10, 1)
    n = torch.tensor([-1.0, 0.0, 1.0, 2.0, 3.0, 5.0, 7.0, 9.0, 12.0, 4.6])
    want = fn(x, n)
    with native():
        got = fn(x.to("tpu"), n.to("tpu")).cpu()
        got_scalar_n = fn(x.to("tpu"), 3).cpu()
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-5)
    torch.testing.assert_close(got_scalar_n, fn(x, 3), rtol=2e-5, atol=1e-5)
