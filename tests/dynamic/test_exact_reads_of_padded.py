"""Exact-shape ops next to padded storages (call_plan.cpp, call_emit.cpp,
padded_layout.cpp: ReadInBuffer) and dynamic ops with device assertions.

An exact op that reads a window of a padded storage (the last position's
hidden state, `cache_position[-1:]`) reads it in the buffer's own elements,
so its executable does not change while the storage's real length grows
inside its bucket; an exact in-place op keeps the storage's padded layout.
`embedding` runs dynamic with its index-bounds assertion. Each test compares
with CPU and counts compiles.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import debug, dynamic


@pytest.fixture(autouse=True)
def auto_mode():
    dynamic.forget_sizes()
    with dynamic.dynamic_shapes("auto"):
        yield


def padded_hidden(n, w):
    """A [1, n, 64] activation kept padded on the device (linear -> gelu)."""
    x = torch.randn(1, n, 64)
    y = F.gelu(x.to("tpu") @ w)
    assert torch_tpu._C._padded_shape(y) != [], "the warm-ups should make the sequence dim dynamic"
    return y, F.gelu(x @ w.cpu())


def test_last_position_read_compiles_once_across_lengths():
    w, head = torch.randn(64, 64).to("tpu"), torch.randn(64, 32).to("tpu")
    for n in (9, 10):  # warm: the second length makes the sequence dim dynamic
        F.gelu(torch.randn(1, n, 64).to("tpu") @ w).cpu()
    y, e = padded_hidden(11, w)
    (y[:, -1, :] @ head).cpu()  # the exact mm over a window of the padded storage
    before = debug.stats()["compiles"]
    for n in (12, 13, 14):
        y, e = padded_hidden(n, w)
        got = y[:, -1, :] @ head
        torch.testing.assert_close(got.cpu(), e[:, -1, :] @ head.cpu(), rtol=1e-4, atol=1e-4)
    assert debug.stats()["compiles"] == before, debug.stats()["compiles_by_op"]


def test_window_reads_of_padded_storages_match_cpu():
    w = torch.randn(64, 64).to("tpu")
    for n in (9, 10):
        F.gelu(torch.randn(1, n, 64).to("tpu") @ w).cpu()
    y, e = padded_hidden(13, w)
    torch.testing.assert_close(y[0, 3:7, 10:20].sum(0).cpu(), e[0, 3:7, 10:20].sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y[0, ::3, 5].exp().cpu(), e[0, ::3, 5].exp(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cumsum(y[0, 2:], 0).cpu(), torch.cumsum(e[0, 2:], 0), rtol=1e-4, atol=1e-4)
    y[0, -1].mul_(2.0)  # an exact in-place write through a window
    e[0, -1].mul_(2.0)
    assert torch_tpu._C._padded_shape(y) != []
    torch.testing.assert_close(y.cpu(), e, rtol=1e-5, atol=1e-5)


def test_dynamic_embedding_checks_its_indices():
    table = torch.randn(256, 16)
    t = table.to("tpu")
    for n in (9, 10):
        F.embedding(torch.randint(0, 256, (1, n)).to("tpu"), t).cpu()
    before = debug.stats()["compiles"]
    for n in (11, 13):
        ids = torch.randint(0, 256, (1, n))
        assert torch.equal(F.embedding(ids.to("tpu"), t).cpu(), F.embedding(ids, table))
    assert debug.stats()["compiles"] == before, debug.stats()["compiles_by_op"]
    ids[0, -1] = 300
    with pytest.raises(IndexError, match="embedding.*index out of range"):
        F.embedding(ids.to("tpu"), t).cpu()
