"""Hugging Face ``kernels`` layers for the "tpu" device, shipped with torch_tpu.

Each subdirectory is a LOCAL kernel repository in a layout the ``kernels``
library loads with ``LocalLayerRepository`` / ``get_local_kernel``:
``<repo>/torch-tpu/{metadata.json, __init__.py, layers.py}``, a noarch build
variant for the ``tpu`` backend (``kernels`` looks for variants in ``<repo>``
and ``<repo>/build``; hub repositories use the latter, which this project's
.gitignore reserves for build trees). ``kernels`` selects the variant because
``torch.backends.tpu`` exists. Nothing is downloaded.

``rms_norm``, layer ``RMSNorm``: replaces layers decorated with
``@use_kernel_forward_from_hub("RMSNorm")`` (Transformers' LlamaRMSNorm and
friends) by one fused, natively lowered ``aten::_fused_rms_norm``.

``moe`` (a module, not a kernel repository): the whole MoE experts forward
as ONE ``torch.tpu.pallas.jax_op``, registered as a Transformers experts
implementation (``moe.register()``, then
``model.set_experts_implementation("torch_tpu_fused")``).

``attention`` (a module): decode attention over a KV cache and flash-style
prefill attention, one ``jax_op`` each, registered with Transformers'
``AttentionInterface`` (``attention.register()``, then
``model.set_attn_implementation("torch_tpu_attention")``).

``dense`` (a module) and ``dense_layers`` (a kernel repository): q/k/v
projections + RoPE, residual add + RMSNorm and the SwiGLU / GeGLU MLP as one
op each; ``dense.kernelize_dense(model)`` makes a Llama-style model's own
layer classes kernelizable and runs ``kernelize(model, device="tpu")`` with
them (and selects the attention kernel).

Usage (no other change to the model code)::

    from kernels import Mode, kernelize, use_kernel_mapping
    from torch_tpu import hub_kernels

    with use_kernel_mapping(hub_kernels.kernel_mapping()):
        kernelize(model, device="tpu", mode=Mode.INFERENCE)

``kernels`` (0.17.x) knows the "tpu" device and backend by itself
(``torch.backends.tpu`` selects its ``TPU`` backend and ``torch-tpu`` build
variants), so no import hook is needed. Transformers 5.24 only wires its own
``@use_kernel_forward_from_hub`` decorators to ``kernels`` >= 0.18.2; with
0.17.x, ``kernels.replace_kernel_forward_from_hub(LlamaRMSNorm, "RMSNorm")``
makes its layers kernelizable.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

__all__ = ["RMS_NORM_REPO", "rms_norm_repository", "kernel_mapping", "kernel_op"]

#: The local kernel repository holding the RMSNorm layer.
RMS_NORM_REPO = Path(__file__).resolve().parent / "rms_norm"


def rms_norm_repository() -> Any:
    """``kernels.LocalLayerRepository`` for torch_tpu's ``RMSNorm`` layer."""
    from kernels import LocalLayerRepository

    return LocalLayerRepository(repo_path=RMS_NORM_REPO, layer_name="RMSNorm")


def kernel_mapping() -> Dict[str, Dict[str, Any]]:
    """A mapping for ``kernels.use_kernel_mapping`` / ``register_kernel_mapping``:
    layer name -> {"tpu": {Mode: repository}}, for inference and training,
    eager or under ``torch.compile`` (the layer is one ATen op either way)."""
    from kernels import Mode

    repo = rms_norm_repository()
    modes = [Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE,
             Mode.TRAINING | Mode.TORCH_COMPILE]
    return {"RMSNorm": {"tpu": {mode: repo for mode in modes}}}


def kernel_op(name: str) -> Any:
    """The registered kernel ``torch_tpu_kernels::<name>`` to call: in eager its
    ``jax_op`` (which skips torch.library's Python dispatch when no gradient
    is recorded), under ``torch.compile`` the ``torch.ops`` entry."""
    import torch

    if torch.compiler.is_compiling():
        return getattr(torch.ops.torch_tpu_kernels, name)
    from torch_tpu.pallas import registered_op

    return registered_op("torch_tpu_kernels::" + name)
