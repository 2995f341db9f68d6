"""Bounded dynamic shapes in fused eager (torch_tpu.fused()): a call whose
signature has gone dynamic runs on its own bounded executable, the chain
records the calls around it, so a new size inside a warm bucket compiles
neither the op nor a chain. The chain runs first when the dynamic call reads
one of its values or writes a storage it holds; a recorded call reads a padded
storage's window out of its buffer and compacts a padded storage it writes.
Every result is compared with PyTorch on the CPU; compiles from debug.stats()."""
import pytest
import torch

import torch_tpu
from torch_tpu import debug

from test_new_shapes_generate import generate, llama, prompt  # noqa: F401 (llama: a fixture)

pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


def fused_run(fn, *args):
    """fn(*args) in fused eager, its results brought to the CPU inside the chain's scope."""
    with torch.no_grad(), torch_tpu.fused():
        out = fn(*args)
        return [t.cpu() for t in out] if isinstance(out, (tuple, list)) else out.cpu()


def program(x, w):
    h = torch.exp(x * 0.5)             # dynamic once the length changed: a padded storage
    r = torch.flip(h, [1])             # exact: recorded, reads the padded storage
    s = (r * 2).softmax(-1)            # dynamic, reads the chain's pending value
    last = h[:, -1] @ w                # exact window of a padded storage (an lm_head)
    h.mul_(3)                          # dynamic in place on a storage the chain holds
    t = torch.flip(h, [1]) + 1         # recorded again: sees the new values
    h[:, 0].fill_(-1.0)                # recorded write to part of a padded storage
    return s, last, t, h.sum(-1)


def test_a_chain_around_dynamic_ops_equals_cpu():
    torch.manual_seed(0)
    w = torch.randn(16, 8)
    dw = w.to("tpu")
    for n in (33, 34, 38, 35, 36, 37):  # 34 turns the length dynamic (bucket 36); 38: bucket 40
        x = torch.randn(3, n, 16)
        debug.reset_stats()
        got = fused_run(program, x.to("tpu"), dw)
        for g, e in zip(got, program(x.clone(), w)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
        if n in (35, 36, 37):
            assert debug.stats()["dynamic_hits"] > 0  # the exp, softmax, mul_, sum ran bounded


def lm_head(x, w):
    """Recorded calls whose sizes do not change with the length, around dynamic ones."""
    h = torch.exp(x * 0.5)                    # dynamic: a padded storage
    last = torch.flip(h[-1] @ w, [0]) * 2     # recorded: the window read out of h's buffer
    h.mul_(3)                                 # dynamic in place on a storage the chain holds
    again = (h[-1] @ w).relu()                # recorded: sees the new values
    return last, again, h.amax(-1) + last.sum()   # dynamic, reads the chain's pending value


def test_recorded_calls_of_fixed_sizes_compile_nothing_at_new_lengths():
    torch.manual_seed(1)
    w = torch.randn(16, 8)
    dw = w.to("tpu")
    for n in (33, 34, 38):
        fused_run(lm_head, torch.randn(n, 16).to("tpu"), dw)
    for n in (35, 36, 37):
        x = torch.randn(n, 16)
        debug.reset_stats()
        got = fused_run(lm_head, x.to("tpu"), dw)
        assert debug.stats()["compiles"] == 0, (n, debug.stats()["compiles_by_op"])
        for g, e in zip(got, lm_head(x, w)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def check_fused_generate(llama, b, n, seed):
    cpu, dev = llama
    ids, mask = prompt(b, n, seed)
    debug.reset_stats()
    with torch_tpu.fused():
        got = generate(dev, ids.to("tpu"), mask.to("tpu")).cpu()
    stats = debug.stats()
    assert torch.equal(got, generate(cpu, ids, mask)), (b, n)
    return stats["compiles"], stats["compiles_by_op"]


def test_fused_generate_new_prompt_lengths_compile_nothing(llama):
    for n in (9, 10, 14):  # as strict eager's test: 10 turns the length dynamic
        check_fused_generate(llama, 1, n, seed=n)
    for n in (11, 12, 13):
        compiles, by_op = check_fused_generate(llama, 1, n, seed=n)
        assert compiles == 0, (n, by_op)


def test_fused_generate_new_batch_sizes_compile_nothing(llama):
    for b in (4, 5):
        check_fused_generate(llama, b, 10, seed=b)
    for b in (3, 6, 7):
        compiles, by_op = check_fused_generate(llama, b, 10, seed=b)
        assert compiles == 0, (b, by_op)
