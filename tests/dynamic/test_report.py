"""debug.report(): why a call was slow (the ops that still recompile per
shape, dynamic executables and hits, fallbacks, the disk cache)."""
from __future__ import annotations

import io

import pytest
import torch

from torch_tpu import debug, dynamic


@pytest.fixture(autouse=True)
def fresh_sizes():
    dynamic.forget_sizes()
    yield


def test_report_names_the_ops_that_recompile_per_shape():
    debug.reset_stats()
    with dynamic.dynamic_shapes("0"):
        for n in (5, 6, 7):
            torch.exp(torch.randn(n, 51).to("tpu")).cpu()
        torch.tanh(torch.randn(5, 51).to("tpu")).cpu()
        out = io.StringIO()
        r = debug.report(file=out)
    assert r["recompiling_ops"] == {"exp": 3}, r["recompiling_ops"]
    assert r["compiles_by_op"]["tanh"] == 1
    assert r["text"] == out.getvalue().rstrip("\n") == str(r)
    assert "recompiling per shape 1 ops" in r["text"] and "TORCH_TPU_DYNAMIC_SHAPES=auto" in r["text"]
    assert r["dynamic"]["mode"] == "0" and r["dynamic"]["executables"] == 0
    assert r["disk_cache"]["enabled"] == bool(r["disk_cache"]["dir"])
    assert "disk cache" in r["text"] and "torch_tpu report" in repr(r)


def test_report_counts_dynamic_executables_apart_from_recompiles():
    debug.reset_stats()
    with dynamic.dynamic_shapes("auto"):
        for n in (9, 10, 12, 15):
            torch.exp(torch.randn(n, 52).to("tpu")).cpu()
    r = debug.report(file=io.StringIO())
    # One static (9) and one dynamic executable (bucket 16): nothing per shape.
    assert r["recompiling_ops"] == {}, r
    assert r["dynamic"]["executables"] == 1 and r["dynamic"]["hits"] == 2, r
    assert r["dynamic"]["compiles_by_op"] == {"exp": 1} and r["compiles_by_op"] == {"exp": 2}, r
    assert "1 dynamic executables, 2 hits" in r["text"] and "recompiling per shape none" in r["text"]


def test_a_compile_queued_on_the_pool_counts_under_its_own_calls_reason():
    # exp's compile runs in the background and is counted when its launch runs,
    # after kthvalue's call: it keeps exp's reason, not the reason of the last call.
    debug.reset_stats()
    with dynamic.dynamic_shapes("auto"):
        x = torch.randn(13, 61).to("tpu")
        a = torch.exp(x)  # its signature's first sizes
        b = torch.kthvalue(x, 3, dim=1).values  # no dynamic rule
        a.cpu(), b.cpu()
    reasons = debug.stats()["exact_reasons"]
    assert reasons["exp"] == {"first sizes of its signature": 1}, reasons
    assert reasons["kthvalue"] == {"not a dynamic-shape op": 1}, reasons
