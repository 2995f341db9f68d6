"""torch_tpu's dense-model layers for Hugging Face ``kernels`` (noarch ``torch-tpu`` build).

``layers`` holds stateless forwards for Llama-style models, each built on
the fused ops of ``torch_tpu.hub_kernels.dense`` / ``.attention``:
``GatedMLP`` (SwiGLU / GeGLU MLP, one op), ``RopeAttention`` (one RoPE op and
the registered attention function), ``PreNormDecoderLayer`` (residual add +
RMSNorm as one op, the MLP with its residual add as one op) and
``RotaryPosEmb`` (the ``rotary_pos_emb`` function hook of Transformers).
"""
from . import layers

__all__ = ["layers"]
