"""One-row products with a contiguous right operand (`x @ W`, GPT-2's Conv1D
`addmm(b, x, W)` at each decode step). On XLA:CPU they are emitted as the
first row of a two-row product behind an optimization barrier
(csrc/lowering/linalg.cpp: TwoRowDot): XLA:CPU runs a single row as a naive
loop, 15x slower at [1, 768] x [768, 3072]. Floating weights of at least
16384 elements; results must equal CPU's for every dtype, epilogue and
layout the rewrite can meet (or refuses), eagerly, compiled and through
backward, and GPT-2's greedy tokens must stay CPU's.
"""
from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401

TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1.6e-2, 1e-1), torch.float16: (1e-3, 5e-2)}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def assert_matches(got, want, dtype=torch.float32):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.cpu(), want, rtol=rtol, atol=atol)


def operands(k, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*s, generator=g).to(dtype) for s in ((1, k), (k, n), (n,)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k, n", [(64, 128), (64, 256), (96, 1000)])  # under, at and over the threshold
def test_one_row_mm_and_addmm_equal_cpu(dtype, k, n):
    x, w, b = operands(k, n, dtype)
    dx, dw, db = x.to("tpu"), w.to("tpu"), b.to("tpu")
    assert_matches(dx @ dw, x @ w, dtype)
    assert_matches(torch.addmm(db, dx, dw), torch.addmm(b, x, w), dtype)
    assert_matches(torch.addmm(db, dx, dw, beta=0.5, alpha=-2.0), torch.addmm(b, x, w, beta=0.5, alpha=-2.0), dtype)


def test_one_row_of_a_batch_and_a_window_of_a_weight():
    x, w, _ = operands(128, 512, torch.float32, seed=1)
    xs = torch.randn(5, 128)
    # a row taken out of a batch (a view at an offset), a column window of the weight
    assert_matches(xs.to("tpu")[3:4] @ w.to("tpu")[:, 100:400], xs[3:4] @ w[:, 100:400])
    # a 3-D input folded to one row (matmul), and beta=0 ignoring a NaN self
    assert_matches(x.view(1, 1, 128).to("tpu") @ w.to("tpu"), x.view(1, 1, 128) @ w)
    nan = torch.full((512,), float("nan"))
    assert_matches(torch.addmm(nan.to("tpu"), x.to("tpu"), w.to("tpu"), beta=0), torch.addmm(nan, x, w, beta=0))


def test_mv_of_one_row_takes_the_plain_product():
    """mv contracts like a 2-D product but its right operand is a vector: not
    the two-row rewrite's (whose weight is a matrix)."""
    a, v = torch.randn(1, 20000), torch.randn(20000)
    torch.testing.assert_close(torch.mv(a.to("tpu"), v.to("tpu")).cpu(), torch.mv(a, v), rtol=1e-4, atol=1e-3)


def test_integer_one_row_product_keeps_its_exact_sum():
    x, w = torch.randint(-50, 50, (1, 200)), torch.randint(-50, 50, (200, 300))
    assert torch.equal((x.to("tpu") @ w.to("tpu")).cpu(), x @ w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_backward_and_compiled(dtype):
    x, w, b = operands(128, 384, dtype, seed=2)

    def f(x, w, b):
        return torch.relu(torch.addmm(b, x, w)).square().sum()

    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    f(*ref).backward()
    for fn in (f, torch.compile(f, backend="tpu")):
        dev = [t.to("tpu").requires_grad_() for t in (x, w, b)]
        out = fn(*dev)
        out.backward()
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(out.cpu().float(), f(x, w, b).float(), rtol=rtol, atol=atol * 10)
        for d, r in zip(dev, ref):
            assert_matches(d.grad, r.grad, dtype)


def test_gpt2_conv1d_decode_tokens_equal_cpu():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.GPT2Config(vocab_size=300, n_embd=128, n_layer=2, n_head=4, n_positions=64)  # Conv1D weights 128x384, 128x512
    cpu = tf.GPT2LMHeadModel(cfg).eval()
    dev = tf.GPT2LMHeadModel(cfg).eval()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("tpu")
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = cpu.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        got = dev.generate(ids.to("tpu"), attention_mask=torch.ones_like(ids).to("tpu"), **kw)
    assert torch.equal(got.cpu(), want)
