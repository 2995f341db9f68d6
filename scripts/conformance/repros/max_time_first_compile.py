"""Repro: StoppingCriteriaTestCase::test_list_criteria fails on tpu (passes on CPU).

Cause: timing, not a wrong result. The test builds MaxTimeCriteria(max_time=0.1) and then
creates its input tensors on the device; it asserts that 0.1 s have NOT passed yet. On tpu the
first op of each new shape is compiled by XLA (about 0.1-0.5 s per op on this loaded 2-core
machine, even with a warm disk cache), so the 0.1 s budget is gone before the criteria run.
Same steps as the test, exit 0 on cpu and 1 on tpu:
    python repros/max_time_first_compile.py [cpu|tpu]
"""
import sys
import time

import torch
from transformers.generation.stopping_criteria import (
    MaxLengthCriteria,
    MaxTimeCriteria,
    StoppingCriteriaList,
)

dev = sys.argv[1] if len(sys.argv) > 1 else "tpu"
if dev == "tpu":
    import torch_tpu  # noqa: F401

    torch.tpu.init()  # client start-up is not what is measured
t0 = time.time()
criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=10), MaxTimeCriteria(max_time=0.1)])
input_ids = torch.randint(0, 250, (3, 5)).to(dev)  # what the test's _get_tensors(5) does
scores = torch.ones((3, 5), device=dev, dtype=torch.float) / 5
stop = all(criteria(input_ids, scores))
print(f"{dev}: {time.time() - t0:.3f} s after MaxTimeCriteria(0.1) was built; stop = {stop} (test expects False)")
sys.exit(1 if stop else 0)
