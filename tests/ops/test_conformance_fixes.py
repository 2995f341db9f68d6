"""Fixes found by running the upstream Transformers tests on tpu (scripts/conformance).

Each test compares with PyTorch on CPU and checks that the tpu calls ran
natively (zero CPU fallbacks).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu


from no_fallback import native


# ------------------------------------------- SDPA without dropout draws nothing
# T5ModelTest::test_generate_with_past_key_values: generate(do_sample=True)
# with and without the KV cache must sample the same tokens after the same
# seed. The SDPA kernel advanced the tpu generator by the size of its output
# even at dropout_p=0, so the attention calls between two samples (whose
# shapes differ with and without a cache) changed the next sample.


def _rng_offset() -> int:
    return int(torch.tpu.get_rng_state()[8:].view(torch.int64).item())


@pytest.mark.parametrize("shape", [(1, 2, 1, 8), (2, 4, 7, 8)])
def test_sdpa_without_dropout_leaves_the_generator_alone(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g) for _ in range(3))
    torch.manual_seed(0)
    before = torch.tpu.get_rng_state()
    with native():
        out = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=True)
    assert torch.equal(torch.tpu.get_rng_state(), before)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_sdpa_with_dropout_still_draws() -> None:
    q, k, v = (torch.randn(1, 2, 5, 8, device="tpu") for _ in range(3))
    torch.manual_seed(0)
    before = _rng_offset()
    with native():
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert _rng_offset() > before
    # Two calls after the same seed drop the same elements; a third differs.
    torch.manual_seed(3)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu()
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu()
    torch.manual_seed(3)
    c = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu()
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_sampling_is_independent_of_attention_shapes_in_between() -> None:
    # What generate() relies on: the samples after a seed do not depend on
    # the no-dropout attention calls between them (as on CPU).
    p = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(1)), -1)

    def samples(dev: str, attn_len: int | None) -> list[list[int]]:
        gx = torch.Generator().manual_seed(2)  # the inputs do not use the default generator
        torch.manual_seed(0)
        out = []
        for step in range(3):
            if attn_len is not None:
                n = attn_len + step
                x = torch.randn(1, 2, n, 8, generator=gx).to(dev)
                F.scaled_dot_product_attention(x, x, x, is_causal=True)
            out.append(torch.multinomial(p.to(dev), 2).cpu().tolist())
        return out

    with native():
        plain = samples("tpu", None)
        assert samples("tpu", 1) == plain
        assert samples("tpu", 6) == plain
    assert samples("cpu", 1) == samples("cpu", 6) == samples("cpu", None)


# ------------------------------------ the same op on tpu:0, then on tpu:1
# Gemma3*ModelTest::test_model_parallelism (device_map over 2 devices): the
# per-op executable cache was keyed without the device, so an op that had
# run on tpu:0 reused device 0's executable for tpu:1 inputs ("Buffer passed
# to Execute() ... is on device TFRT_CPU_1, but replica is assigned to device
# TFRT_CPU_0"). Needs 2 devices: runs in a subprocess.

_TWO_DEVICES = r"""
import torch, torch_tpu
assert torch.tpu.device_count() == 2
torch_tpu.debug.reset_stats()
x = torch.arange(12).reshape(3, 4)
outs = []
for d in ("tpu:0", "tpu:1", "tpu:0"):
    t = torch.arange(12, device=d).reshape(3, 4)      # arange.start_out
    y = (t[:, None, :].float() * 2 + 1).sum(-1)       # view, _to_copy, mul, add, sum
    assert y.device == torch.device(d), y.device
    outs.append(y.cpu())
ref = (x[:, None, :].float() * 2 + 1).sum(-1)
for o in outs:
    assert torch.equal(o, ref), (o, ref)
assert not dict(torch_tpu.debug.stats()["fallbacks"]), torch_tpu.debug.stats()["fallbacks"]
print("ok")
"""


@pytest.mark.skipif(torch.tpu.get_platform() != "cpu",
                    reason="TORCH_TPU_CPU_DEVICES gives two devices only on the XLA:CPU plugin")
@pytest.mark.parametrize("fused", ["0", "1"])
def test_same_op_on_two_devices(fused: str) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCH_TPU_CPU_DEVICES="2", TORCH_TPU_DEFER_AND_FUSE=fused)
    r = subprocess.run([sys.executable, "-c", _TWO_DEVICES], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
