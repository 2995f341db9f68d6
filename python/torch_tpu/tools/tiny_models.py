"""Tiny Transformers models (random weights, no hub) and matching inputs.

One entry per architecture family that torch_tpu is checked against: each
``build()`` makes a model from a config of a few thousand parameters (hidden
size 32, two layers, no dropout) and each ``inputs()`` makes CPU tensors that
drive the forward pass to a loss, so a forward and a training step cover the
model's whole op set. Used by ``python -m torch_tpu.tools.coverage --model``
and by ``tests/models/test_transformers_models.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

VOCAB = 128
BATCH = 2
SEQ = 12


@dataclass(frozen=True)
class TinyModel:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.Generator], dict[str, torch.Tensor]]
    outputs: tuple[str, ...]  # output fields compared besides the loss


def _ids(g: torch.Generator, length: int = SEQ, low: int = 3) -> torch.Tensor:
    return torch.randint(low, VOCAB, (BATCH, length), generator=g)


def _lm_inputs(g: torch.Generator) -> dict[str, torch.Tensor]:
    ids = _ids(g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding on the second row
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


_DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _llama() -> torch.nn.Module:
    import transformers as tf
    return tf.LlamaForCausalLM(tf.LlamaConfig(**_DECODER))


def _qwen3() -> torch.nn.Module:
    import transformers as tf
    return tf.Qwen3ForCausalLM(tf.Qwen3Config(**_DECODER, head_dim=8))


def _qwen3_moe() -> torch.nn.Module:
    import transformers as tf
    cfg = tf.Qwen3MoeConfig(**_DECODER, head_dim=8, moe_intermediate_size=32, num_experts=4,
                            num_experts_per_tok=2, decoder_sparse_step=1, output_router_logits=True,
                            router_aux_loss_coef=0.01)
    return tf.Qwen3MoeForCausalLM(cfg)


def _gemma3() -> torch.nn.Module:
    import transformers as tf
    cfg = tf.Gemma3TextConfig(**_DECODER, head_dim=8, sliding_window=4,
                              layer_types=["sliding_attention", "full_attention"],
                              final_logit_softcapping=30.0, attn_logit_softcapping=None)
    return tf.Gemma3ForCausalLM(cfg)


def _mistral() -> torch.nn.Module:
    import transformers as tf
    return tf.MistralForCausalLM(tf.MistralConfig(**_DECODER, head_dim=8, sliding_window=6))


def _gpt2() -> torch.nn.Module:
    import transformers as tf
    cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return tf.GPT2LMHeadModel(cfg)


def _bert() -> torch.nn.Module:
    import transformers as tf
    cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return tf.BertForMaskedLM(cfg)


def _bert_inputs(g: torch.Generator) -> dict[str, torch.Tensor]:
    ids = _ids(g)
    labels = ids.clone()
    labels[:, ::3] = -100  # only some positions are predicted
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0  # right padding on the second row
    return {"input_ids": ids, "attention_mask": mask,
            "token_type_ids": (torch.arange(SEQ) >= SEQ // 2).long().expand(BATCH, SEQ).contiguous(),
            "labels": labels}


def _t5() -> torch.nn.Module:
    import transformers as tf
    cfg = tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return tf.T5ForConditionalGeneration(cfg)


def _t5_inputs(g: torch.Generator) -> dict[str, torch.Tensor]:
    ids = _ids(g)
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    labels = _ids(g, length=8)
    labels[0, -2:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _vit() -> torch.nn.Module:
    import transformers as tf
    cfg = tf.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, num_labels=5)
    return tf.ViTForImageClassification(cfg)


def _vit_inputs(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
            "labels": torch.randint(0, 5, (BATCH,), generator=g)}


def _whisper() -> torch.nn.Module:
    import transformers as tf
    cfg = tf.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                           decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32,
                           dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                           suppress_tokens=None, begin_suppress_tokens=None)
    return tf.WhisperForConditionalGeneration(cfg)


def _whisper_inputs(g: torch.Generator) -> dict[str, torch.Tensor]:
    # input_features: (batch, mel bins, 2 * max_source_positions) frames
    return {"input_features": torch.randn(BATCH, 16, 32, generator=g), "labels": _ids(g, length=8)}


def _clip() -> torch.nn.Module:
    import transformers as tf
    cfg = tf.CLIPConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=16, eos_token_id=2,
                         attention_dropout=0.0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, image_size=16, patch_size=4, attention_dropout=0.0),
        projection_dim=16)
    return tf.CLIPModel(cfg)


def _clip_inputs(g: torch.Generator) -> dict[str, torch.Tensor]:
    ids = _ids(g, length=10)
    ids[0, -1] = 2  # eos token: the text embedding is read at the eos position
    ids[1, 6] = 2
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
            "return_loss": True}


MODELS: dict[str, TinyModel] = {m.name: m for m in [
    TinyModel("llama", _llama, _lm_inputs, ("logits",)),
    TinyModel("qwen3", _qwen3, _lm_inputs, ("logits",)),
    TinyModel("qwen3_moe", _qwen3_moe, _lm_inputs, ("logits", "aux_loss")),
    TinyModel("gemma3", _gemma3, _lm_inputs, ("logits",)),
    TinyModel("mistral", _mistral, _lm_inputs, ("logits",)),
    TinyModel("gpt2", _gpt2, _lm_inputs, ("logits",)),
    TinyModel("bert", _bert, _bert_inputs, ("logits",)),
    TinyModel("t5", _t5, _t5_inputs, ("logits", "encoder_last_hidden_state")),
    TinyModel("vit", _vit, _vit_inputs, ("logits",)),
    TinyModel("whisper", _whisper, _whisper_inputs, ("logits", "encoder_last_hidden_state")),
    TinyModel("clip", _clip, _clip_inputs, ("logits_per_image", "text_embeds", "image_embeds")),
]}


def make(name: str, seed: int = 0) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A tiny model on CPU in train mode (no dropout) and its CPU inputs, both from ``seed``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    spec = MODELS[name]
    torch.manual_seed(seed)
    model = spec.build().train()
    inputs = spec.inputs(torch.Generator().manual_seed(seed + 1))
    return model, inputs


def to(inputs: dict[str, Any], device: Any) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
