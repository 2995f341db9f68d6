"""float8 (float8_e4m3fn, float8_e5m2) on tpu: storage, transfers and conversions.

PyTorch supports little arithmetic on float8 (on CPU most ops raise); what
real code does with it is store weights in float8 and convert them to a
compute dtype (Diffusers' layerwise casting, FP8 checkpoints). Conversions
must give CPU's bits: round to nearest even, float8_e4m3fn saturating to
+-448 (inf too), float8_e5m2 overflowing to inf.
"""
import pytest
import torch

import torch_tpu

F8 = [torch.float8_e4m3fn, torch.float8_e5m2]
WIDE = [torch.float32, torch.bfloat16, torch.float16]

SPECIAL = [0.0, -0.0, 1.0, -2.5, 0.1, 3.14159, 447.0, 448.0, 460.0, 464.0, 1e6, -1e6,
           float("inf"), float("-inf"), 1e-9, 2.0 ** -9, 2.0 ** -10, 2.0 ** -16, 2.0 ** -17,
           57344.0, 61440.0, 0.0625 * 1.0625, 0.0625 * 1.1875]


def bits(t):
    """uint8 bits with every NaN mapped to one pattern (the NaN encodings differ)."""
    b = t.cpu().view(torch.uint8).clone()
    b[torch.isnan(t.cpu().float())] = 0xFF
    return b


@pytest.fixture(autouse=True)
def _no_fallbacks():
    torch_tpu.debug.reset_stats()
    yield
    assert torch_tpu.debug.stats()["fallbacks"] == {}


@pytest.mark.parametrize("f8", F8)
@pytest.mark.parametrize("wide", WIDE)
def test_convert_to_float8_matches_cpu_bits(f8, wide):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor(SPECIAL + [float("nan")]),
                   torch.randn(4000, generator=g) * torch.logspace(-12, 12, 4000, base=2)])
    x = x.to(wide)
    got = x.to("tpu").to(f8)
    assert got.dtype == f8 and got.device.type == "tpu"
    assert torch.equal(bits(got), bits(x.to(f8)))


@pytest.mark.parametrize("f8", F8)
@pytest.mark.parametrize("wide", WIDE)
def test_convert_from_float8_and_transfers(f8, wide):
    every = torch.arange(256, dtype=torch.uint8).view(f8)  # all 256 codes
    dev = every.to("tpu")
    assert torch.equal(bits(dev), bits(every))  # upload + download keep the bits
    out = dev.to(wide).cpu()
    ref = every.to(wide)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(0.0), ref.nan_to_num(0.0))


@pytest.mark.parametrize("f8", F8)
def test_float8_factories_views_and_copies(f8):
    z = torch.zeros(2, 3, dtype=f8, device="tpu")
    assert torch.equal(bits(z), bits(torch.zeros(2, 3, dtype=f8)))
    f = torch.full((5,), -1.75, dtype=f8, device="tpu")
    assert torch.equal(bits(f), bits(torch.full((5,), -1.75, dtype=f8)))
    x = torch.randn(6, 8)
    d = x.to("tpu").to(f8)
    # Views, a strided copy and copy_ into an existing float8 tensor.
    assert torch.equal(bits(d[1:4, ::2].contiguous()), bits(x.to(f8)[1:4, ::2].contiguous()))
    assert torch.equal(bits(d.t().clone()), bits(x.to(f8).t().clone()))
    e = torch.empty(6, 8, dtype=f8, device="tpu")
    e.copy_(d)
    assert torch.equal(bits(e), bits(x.to(f8)))
    e.copy_(x.to("tpu") * 2)  # copy_ converts
    assert torch.equal(bits(e), bits((x * 2).to(f8)))


def test_module_stored_in_float8_computes_in_bfloat16():
    """The layerwise-casting pattern: weights stored in float8, cast per use."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    ref_w = lin.weight.detach().to(torch.float8_e4m3fn)
    dev = torch.nn.Linear(16, 8).to("tpu")
    dev.load_state_dict(lin.state_dict())
    dev.to(torch.float8_e4m3fn)
    assert dev.weight.dtype == torch.float8_e4m3fn and dev.weight.device.type == "tpu"
    assert torch.equal(bits(dev.weight.detach()), bits(ref_w))
    dev.to(torch.bfloat16)
    out = dev(x.to("tpu", torch.bfloat16)).float().cpu()
    cpu = torch.nn.functional.linear(x.bfloat16(), ref_w.bfloat16(),
                                     lin.bias.detach().to(torch.float8_e4m3fn).bfloat16())
    torch.testing.assert_close(out, cpu.float(), rtol=1.6e-2, atol=1e-2)
