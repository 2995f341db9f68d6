"""Architectures beyond the issue's list: forward + backward on tpu equal CPU, zero fallbacks.

Tiny configs, random weights, eval mode (dropout off, so both devices compute
the same function). Covers ALiBi (Bloom), learned positions (OPT), parallel
attention (GPT-NeoX), disentangled attention (DeBERTa-v2), encoder-decoder
(BART), window attention with roll (Swin), conv nets with batch/layer norm
(ResNet, ConvNeXt), weight-normed conv positional embeddings (Wav2Vec2) and a
segmentation head with 2-D cross entropy (SegFormer).
"""
import copy

import pytest
import torch
import torch_tpu

transformers = pytest.importorskip("transformers")
T = transformers


def _text(b=2, s=8, vocab=99):
    return {"input_ids": torch.randint(3, vocab, (b, s)),
            "attention_mask": torch.ones(b, s, dtype=torch.long)}


def _lm(b=2, s=8):
    return {**_text(b, s), "labels": torch.randint(3, 99, (b, s))}


def _cls(x):
    return {**x, "labels": torch.tensor([0, 2])}


def _image():
    return {"pixel_values": torch.randn(2, 3, 32, 32)}


CASES = {
    "phi3": (lambda: T.Phi3ForCausalLM(T.Phi3Config(
        vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)), _lm),
    "bloom": (lambda: T.BloomForCausalLM(T.BloomConfig(
        vocab_size=99, hidden_size=32, n_layer=2, n_head=4)), _lm),
    "opt": (lambda: T.OPTForCausalLM(T.OPTConfig(
        vocab_size=99, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=32)), _lm),
    "gpt_neox": (lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4)), _lm),
    "roberta": (lambda: T.RobertaForSequenceClassification(T.RobertaConfig(
        vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_labels=3)), lambda: _cls(_text())),
    "distilbert": (lambda: T.DistilBertForMaskedLM(T.DistilBertConfig(
        vocab_size=99, dim=32, hidden_dim=64, n_layers=2, n_heads=4)), _lm),
    "deberta_v2": (lambda: T.DebertaV2ForSequenceClassification(T.DebertaV2Config(
        vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_labels=3)), lambda: _cls(_text())),
    "bart": (lambda: T.BartForConditionalGeneration(T.BartConfig(
        vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=64)), _lm),
    "resnet": (lambda: T.ResNetForImageClassification(T.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=3)),
        lambda: _cls(_image())),
    "convnext": (lambda: T.ConvNextForImageClassification(T.ConvNextConfig(
        num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=3)),
        lambda: _cls(_image())),
    "swin": (lambda: T.SwinForImageClassification(T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
        window_size=4, num_labels=3)), lambda: _cls(_image())),
    "wav2vec2": (lambda: T.Wav2Vec2ForSequenceClassification(T.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, num_labels=3)),
        lambda: {"input_values": torch.randn(2, 400), "labels": torch.tensor([0, 2])}),
    "segformer": (lambda: T.SegformerForSemanticSegmentation(T.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        num_attention_heads=[1, 2], decoder_hidden_size=32, num_labels=3)),
        lambda: {**_image(), "labels": torch.randint(0, 3, (2, 32, 32))}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_backward_match_cpu_without_fallbacks(name):
    build, make_inputs = CASES[name]
    torch.manual_seed(0)
    model = build().eval()
    inputs = make_inputs()
    cpu = copy.deepcopy(model)
    loss_cpu = cpu(**inputs).loss
    loss_cpu.backward()

    tpu = copy.deepcopy(model).to("tpu")
    torch_tpu.debug.reset_stats()
    loss_tpu = tpu(**{k: v.to("tpu") for k, v in inputs.items()}).loss
    loss_tpu.backward()
    torch.tpu.synchronize()
    assert torch_tpu.debug.stats()["fallbacks"] == {}

    torch.testing.assert_close(loss_tpu.detach().cpu(), loss_cpu.detach(), rtol=1e-5, atol=1e-5)
    for (n, p), q in zip(tpu.named_parameters(), cpu.parameters()):
        if q.grad is None:
            assert p.grad is None, n
            continue
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=n)
