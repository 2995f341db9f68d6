"""Small dynamic sizes (a batch) pad past 1.25x only while it costs little
memory (csrc/aten/dynamic.cpp: AffordablePadding).

A batch of 3 may take a warm bucket 8 when its tensors are small: a compile
saved for a few KiB. A tensor whose padding past 1.25x would cost more than
1 MiB (TORCH_TPU_PADDING_SLACK_BYTES) takes a fine bucket instead (1-4 exact,
then every even size: at most 1.2x its rows), so a large model's activations
and caches stay near their exact bytes. Each test uses its own column count
so that signatures do not share state.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import debug, dynamic

MIB_ROW = 262144  # float32 columns: one row holds 1 MiB


@pytest.fixture(autouse=True)
def auto_mode():
    dynamic.forget_sizes()
    with dynamic.dynamic_shapes("auto"):
        yield


def run_exp(n, cols):
    """exp of an [n, cols] tensor on tpu, checked against CPU; its padded shape and the step's compiles."""
    debug.reset_stats()
    x = torch.randn(n, cols)
    y = torch.exp(x.to("tpu"))
    torch.testing.assert_close(y.cpu(), torch.exp(x))
    return torch_tpu._C._padded_shape(y), debug.stats()["compiles"]


def test_small_rows_reuse_a_warm_coarse_bucket():
    # 5 makes the batch dynamic at bucket 8 (3 rows of 252 B: affordable);
    # 3, 6 and 7 then take it without compiling.
    assert run_exp(4, 63)[1] == 1
    assert run_exp(5, 63) == ([8, 63], 1)
    for n in (3, 6, 7):
        assert run_exp(n, 63) == ([8, 63], 0), n


def test_megabyte_rows_take_fine_buckets():
    assert run_exp(4, MIB_ROW)[1] == 1
    # 5: bucket 6 (1.2x), not 8 (3 MiB of padding).
    assert run_exp(5, MIB_ROW) == ([6, MIB_ROW], 1)
    assert run_exp(6, MIB_ROW) == ([6, MIB_ROW], 0)
    # 3 refuses the warm 6 (3 MiB more) and takes 4: one row, 1 MiB, within the slack.
    assert run_exp(3, MIB_ROW) == ([4, MIB_ROW], 1)
    assert run_exp(7, MIB_ROW) == ([8, MIB_ROW], 1)
    assert run_exp(9, MIB_ROW) == ([10, MIB_ROW], 1)
    assert run_exp(10, MIB_ROW) == ([10, MIB_ROW], 0)


def test_a_wide_result_does_not_follow_its_narrow_input_to_a_coarse_bucket():
    # exp's [n, 16] results sit at bucket 8 (64 B rows); the linear reading
    # them writes [n, 131072] (512 KiB rows): it reads a window of 6 rows of
    # the 8-row buffer and keeps its result at 6 (1 MiB of padding, not 1.5).
    w = torch.randn(131072, 16)
    w_tpu = w.to("tpu")
    for n in (4, 5):
        x = torch.randn(n, 16)
        h = torch.exp(x.to("tpu"))
        out = F.linear(h, w_tpu)
        torch.testing.assert_close(out.cpu(), F.linear(torch.exp(x), w), rtol=1e-5, atol=1e-4)
    assert torch_tpu._C._padded_shape(h) == [8, 16]
    assert torch_tpu._C._padded_shape(out) == [6, 131072]


def test_slack_zero_keeps_every_small_dim_within_1_2x():
    code = (
        "import torch, torch_tpu\n"
        "from torch_tpu import debug\n"
        "shapes = []\n"
        "for n in (4, 5, 3, 7):\n"
        "    x = torch.randn(n, 64)\n"
        "    y = torch.exp(x.to('tpu'))\n"
        "    torch.testing.assert_close(y.cpu(), torch.exp(x))\n"
        "    shapes.append(torch_tpu._C._padded_shape(y))\n"
        "print(shapes, debug.stats()['compiles'])\n"
    )
    env = dict(os.environ, TORCH_TPU_PADDING_SLACK_BYTES="0", TORCH_TPU_DYNAMIC_SHAPES="auto",
               TORCH_TPU_CACHE_DIR="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # 4: static; 5: bucket 6; 3: its own bucket 3 (no padding); 7: bucket 8.
    assert out.stdout.split("\n")[-2] == "[[], [6, 64], [3, 64], [8, 64]] 4", out.stdout
