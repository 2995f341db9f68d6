"""Layers for ``kernels.kernelize``: their ``forward`` replaces the decorated layer's."""
import torch
from torch import nn


class SiluAndMul(nn.Module):
    """``silu(x[..., :d]) * x[..., d:]`` as one Pallas kernel (forward and backward)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from . import silu_and_mul

        return silu_and_mul(x)
