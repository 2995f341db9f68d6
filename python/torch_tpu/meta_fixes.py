"""Fixes to PyTorch's Python meta kernels that tpu ops reach.

The generic tpu kernel sizes each op's outputs with PyTorch's meta kernel.
Where that kernel is wrong for inputs the real kernels accept, the op would
fail on tpu (and under torch.compile's fake tensors) although CUDA runs it.
"""
from __future__ import annotations

from typing import Any

import torch


def _fix_rnn_cell_check_sizes() -> None:
    """``nn.LSTM(bias=False)`` on tpu.

    ATen's LSTM loop calls ``_thnn_fused_lstm_cell(igates, hgates, cx, None,
    None)`` without biases; the meta kernel's shared size check
    (``rnn_cell_checkSizes``) reads ``.device`` of every input, the missing
    biases included, and raises AttributeError. The meta kernel looks the
    check up as a module global at call time, so it is replaced by one that
    checks bias-less calls with a stand-in bias of the right shape (meta
    tensors only: nothing is allocated).
    """
    import torch._meta_registrations as meta

    original = getattr(meta, "rnn_cell_checkSizes", None)
    if original is None or getattr(original, "_torch_tpu_fixed", False):
        return

    def rnn_cell_checkSizes(  # noqa: N802  (PyTorch's name)
        input_gates: torch.Tensor,
        hidden_gates: torch.Tensor,
        input_bias: Any,
        hidden_bias: Any,
        factor: int,
        prev_hidden: torch.Tensor,
    ) -> None:
        if input_bias is None and hidden_bias is None and input_gates.ndim == 2:
            input_bias = hidden_bias = input_gates.new_empty(input_gates.shape[1:])
        original(input_gates, hidden_gates, input_bias, hidden_bias, factor, prev_hidden)

    rnn_cell_checkSizes._torch_tpu_fixed = True  # type: ignore[attr-defined]
    meta.rnn_cell_checkSizes = rnn_cell_checkSizes


def install() -> None:
    """Applies every fix (idempotent)."""
    _fix_rnn_cell_check_sizes()
