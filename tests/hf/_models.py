"""Tiny Hugging Face models built from configs with random weights (no hub)."""
from __future__ import annotations

import torch

VOCAB = 128


def _causal(name: str):
    import transformers as tf

    if name == "llama":
        cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return tf.LlamaForCausalLM(cfg)
    if name == "qwen3":
        cfg = tf.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
        return tf.Qwen3ForCausalLM(cfg)
    if name == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                num_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
        return tf.Qwen3MoeForCausalLM(cfg)
    if name == "gemma3":
        cfg = tf.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  max_position_embeddings=64, sliding_window=16)
        return tf.Gemma3ForCausalLM(cfg)
    if name == "gpt2":
        cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        return tf.GPT2LMHeadModel(cfg)
    if name == "t5":
        cfg = tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                          num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        return tf.T5ForConditionalGeneration(cfg)
    raise ValueError(name)


def build(name: str, seed: int = 0):
    """Returns (cpu_model, tpu_model) with identical random weights, in eval mode."""
    torch.manual_seed(seed)
    cpu = _causal(name).eval()
    dev = _causal(name).eval()
    dev.load_state_dict(cpu.state_dict())
    for m in (cpu, dev):  # no eos: always generate max_new_tokens
        m.generation_config.eos_token_id = None
        if m.generation_config.pad_token_id is None:
            m.generation_config.pad_token_id = 0
    return cpu, dev.to("tpu")


def prompt(batch: int = 1, length: int = 6, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (batch, length), generator=g)


def tokenizer():
    """A word-level tokenizer over VOCAB words "w0".. (ids 0-2: <pad>, <unk>, <eos>), built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
