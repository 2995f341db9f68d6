"""nn.TransformerEncoder(Layer) and nn.MultiheadAttention eval fast paths on tpu.

In eval mode without grad, PyTorch routes them to _transformer_encoder_layer_fwd
and _native_multi_head_attention (for cpu, cuda and the PrivateUse1 device);
on tpu these are composed of native ops (csrc/aten/transformer_fast_path.cpp).
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from no_fallback import native




@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_encoder_eval_fast_path_matches_cpu(norm_first: bool, activation: str) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True,
                                       norm_first=norm_first, activation=activation)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 5, 16)
    pad = torch.tensor([[False] * 5, [False, False, False, True, True], [False] * 4 + [True]])
    tpu = copy.deepcopy(model).to("tpu")
    with torch.no_grad():
        for mask in (None, pad):
            ref = model(x, src_key_padding_mask=mask)
            with native():
                got = tpu(x.to("tpu"), src_key_padding_mask=None if mask is None else mask.to("tpu"))
            torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
        causal = nn.Transformer.generate_square_subsequent_mask(5)
        ref = model(x, mask=causal, is_causal=True)
        with native():
            got = tpu(x.to("tpu"), mask=causal.to("tpu"), is_causal=True)
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_fast_path_op_is_used() -> None:
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True).eval().to("tpu")
    x = torch.randn(2, 3, 8, device="tpu")
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        layer(x)
    assert any("_transformer_encoder_layer_fwd" in e.key for e in prof.key_averages())


def test_multihead_attention_fast_path_and_weights() -> None:
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    tpu = copy.deepcopy(mha).to("tpu")
    with torch.no_grad():
        for need_weights in (False, True):
            ref = mha(x, x, x, key_padding_mask=pad, need_weights=need_weights)
            with native():
                got = tpu(*(x.to("tpu"),) * 3, key_padding_mask=pad.to("tpu"),
                          need_weights=need_weights)
            torch.testing.assert_close(got[0].cpu(), ref[0], rtol=1e-5, atol=1e-5)
            if need_weights:
                torch.testing.assert_close(got[1].cpu(), ref[1], rtol=1e-5, atol=1e-5)
