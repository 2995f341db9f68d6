"""Kernel layers: stateless ``nn.Module`` subclasses whose ``forward`` replaces
the decorated layer's forward (``self`` is the original module instance)."""
import torch
from torch import nn


class RMSNorm(nn.Module):
    """Transformers' RMSNorm (``weight * normalize(x).to(x.dtype)``) as one fused op.

    ``aten::_fused_rms_norm`` normalizes in float32 (float64 for double
    inputs), rounds to the input dtype, then scales by the weight in the
    promoted dtype: the same rounding steps as LlamaRMSNorm's eager code. The
    module's own ``weight`` and ``variance_epsilon`` (or ``eps``) are used.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        eps = self.variance_epsilon if hasattr(self, "variance_epsilon") else self.eps
        return torch.nn.functional.rms_norm(
            hidden_states, (hidden_states.shape[-1],), self.weight, eps
        )
