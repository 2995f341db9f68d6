"""The compile-burst log: one line per slow burst of compiles
(csrc/aten/compile_log.cpp, torch_tpu/compile_log.py), never one per compile."""
from __future__ import annotations

import logging

import pytest
import torch

from torch_tpu import debug, dynamic


@pytest.fixture(autouse=True)
def fresh_sizes():
    dynamic.forget_sizes()
    yield


def burst_records(caplog, sizes, cols):
    debug.reset_stats()  # a new burst
    with caplog.at_level(logging.WARNING, logger="torch_tpu"), dynamic.dynamic_shapes("0"):
        for n in sizes:
            torch.exp(torch.randn(n, cols).to("tpu")).cpu()
    return [r for r in caplog.records if r.name == "torch_tpu" and "new executable" in r.getMessage()]


def test_a_slow_burst_logs_one_line(caplog, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_COMPILE_LOG_SECONDS", "1e-9")  # any compile is "slow"
    records = burst_records(caplog, (5, 6, 7, 9), 53)
    assert len(records) == 1, [r.getMessage() for r in records]
    msg = records[0].getMessage()
    assert "1 new executable compiled in" in msg and "TORCH_TPU_DYNAMIC_SHAPES=auto" in msg, msg
    assert "disk cache" in msg and "debug.report()" in msg, msg


def test_a_fast_burst_and_the_off_switch_log_nothing(caplog, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_COMPILE_LOG_SECONDS", "1000")
    assert burst_records(caplog, (5, 6), 54) == []
    monkeypatch.setenv("TORCH_TPU_COMPILE_LOG_SECONDS", "0")
    assert burst_records(caplog, (5, 6), 55) == []
