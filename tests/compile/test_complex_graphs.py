"""Complex values in torch.compile(backend="tpu") graphs: view_as_complex /
view_as_real are values in a functional graph, complex multiply and the fft
ops lower like eager ones."""
import torch

import torch_tpu


def _fallbacks():
    return dict(torch_tpu.debug.stats()["fallbacks"])


def test_compiled_rope_and_fft_graphs_are_native():
    """torch.compile(backend="tpu"): view_as_complex / view_as_real, complex
    multiply and an rfft magnitude lower into graph modules (no eager graph)."""
    def rope(x, freqs):
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(2) + torch.fft.rfft(x, dim=-1).abs().sum()

    g = torch.Generator().manual_seed(14)
    x = torch.randn(4, 3, 8, generator=g)
    freqs = torch.polar(torch.ones(4, 1, 4), torch.randn(4, 1, 4, generator=g))
    compiled = torch.compile(rope, backend="tpu", fullgraph=True)
    before = _fallbacks()
    out = compiled(x.to("tpu"), freqs.to("tpu"))
    assert _fallbacks() == before
    stats = torch_tpu.compile.stats()
    assert stats["native_graphs"] == stats["graphs"] >= 1 and stats["fallback_graphs"] == 0
    torch.testing.assert_close(out.cpu(), rope(x, freqs), rtol=1e-5, atol=1e-5)
