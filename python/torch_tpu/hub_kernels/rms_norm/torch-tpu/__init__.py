"""torch_tpu's RMSNorm kernel for Hugging Face ``kernels`` (noarch ``torch-tpu`` build).

``layers.RMSNorm`` replaces the forward of layers decorated with
``@use_kernel_forward_from_hub("RMSNorm")`` (Transformers' LlamaRMSNorm,
Qwen2/3, Mistral, ...). Its forward is ONE fused op, ``aten::_fused_rms_norm``
(and ``_fused_rms_norm_backward`` in training), both lowered natively by
torch_tpu, instead of the eager chain pow / mean / add / rsqrt / mul / mul.
"""
from . import layers

__all__ = ["layers"]
