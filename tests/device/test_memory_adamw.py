"""Peak device memory of an AdamW step against the live bytes it needs.

The step needs parameters P, gradients G and optimizer state S (2P); its
peak, read from torch.tpu.max_memory_allocated(), must stay within 2% of
P + G + S in the modes that avoid PyTorch's foreach temporary: fused eager
(the _foreach_sqrt temporary dies inside the recorded chain and never
becomes a buffer) and a compiled step. Strict eager with the default foreach
AdamW pays one parameter-sized temporary (as on CUDA); fused=True does not.
After each step the PJRT buffers the process holds must add up to
memory_allocated() (no buffer left behind by a donation).
"""
import pytest
import torch

import torch_tpu

SLACK = 4096  # bytes of cached scalar buffers the runtime keeps (not storages)


def _setup(**adamw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 128)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **adamw)
    x = torch.randn(8, 128, device="tpu")
    return model, opt, x


def _peak_ratio(model, opt, x, step, fused=False):
    for _ in range(3):  # warm-up: optimizer state, compiles; the last grads stay
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        if _ < 2:
            step()
    torch.tpu.synchronize()
    params = list(model.parameters())
    need = sum(p.numel() * p.element_size() * 4 for p in params)  # P + G + exp_avg + exp_avg_sq
    need += x.numel() * x.element_size()
    torch.tpu.reset_peak_memory_stats()
    if fused:
        with torch_tpu.fused():
            step()
    else:
        step()
    torch.tpu.synchronize()
    plugin = torch_tpu._C._plugin_memory(0)["live_buffer_bytes"]
    assert abs(plugin - torch.tpu.memory_allocated()) <= SLACK
    return torch.tpu.max_memory_allocated() / need


def test_fused_eager_foreach_adamw_peak():
    model, opt, x = _setup()
    assert _peak_ratio(model, opt, x, opt.step, fused=True) <= 1.02


def test_compiled_adamw_step_peak():
    model, opt, x = _setup(capturable=True)
    step = torch.compile(opt.step, backend="tpu")
    assert _peak_ratio(model, opt, x, step) <= 1.02


def test_strict_fused_adamw_peak_and_foreach_temporary():
    model, opt, x = _setup(fused=True)
    assert _peak_ratio(model, opt, x, opt.step) <= 1.02
    model, opt, x = _setup()  # foreach: one parameter-sized temporary, as on CUDA
    assert _peak_ratio(model, opt, x, opt.step) == pytest.approx(1.2, abs=0.06)


def test_fused_chain_counts_buffers_it_still_reads():
    """A storage freed while a recorded chain reads it stays counted until the chain runs."""
    a = torch.randn(1024, device="tpu")
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    with torch_tpu.fused():
        b = a * 2
        del a  # its buffer is a parameter of the chain
        c = (b + 1).sum()
        assert torch.tpu.memory_allocated() >= base + 4096  # a (held) and b
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == base + 4  # b replaced a; c
    assert torch.tpu.max_memory_allocated() >= base + 4096  # a and b coexisted in the chain
    assert abs(torch_tpu._C._plugin_memory(0)["live_buffer_bytes"]
               - torch.tpu.memory_allocated()) <= SLACK
    del b, c
