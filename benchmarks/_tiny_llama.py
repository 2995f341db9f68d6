"""The tiny Llama the generate() benchmarks share: 2 layers, hidden 64, 4
heads (2 KV heads), vocab 256; random weights from seed 0, the same on the
CPU and on tpu, greedy without an EOS stop."""
from __future__ import annotations

import torch


def config(**overrides):
    import transformers as tf

    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return tf.LlamaConfig(**{**kw, **overrides})


def greedy_pair(**overrides):
    """(cpu_model, tpu_model) in eval mode; `overrides` go to the config."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = config(**overrides)
    cpu = tf.LlamaForCausalLM(cfg).eval()
    dev = tf.LlamaForCausalLM(cfg).eval()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("tpu")
    for m in (cpu, dev):
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    return cpu, dev
