"""torch.compile(backend="tpu") of a tiny Transformers Llama with symbolic
shapes: ``dynamic=True`` and Dynamo's automatic dynamic shapes trace one
graph and build one bounded-dynamic module per size bucket, so prompts of
new lengths inside the bucket compile nothing; logits, losses and gradients
equal PyTorch's on the CPU.

What this needed (each would make the test fail): the attention backend
choice reads symbolic sizes without specializing them (it had made Dynamo
guard on the sequence length: one graph per length); floats Dynamo passes as
0-d CPU tensors (rms_norm_eps, the rotary scaling) are values of the module;
Dynamo's restart signal passes through the backend; `32*ceil(s/32)` counts as
monotone; a graph compiled per shape specializes its inputs' `.item()` reads.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import torch_tpu
import torch_tpu.compile as tpu_compile

transformers = pytest.importorskip("transformers", reason="transformers not installed (scripts/install.sh)")

VOCAB = 128
TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def _exact_eager():
    """Eager ops around the compiled calls run exact shapes: the executables
    counted are the graphs' own."""
    before = torch_tpu._C._dynamic_shapes()
    torch_tpu.dynamic.set_mode("0")
    yield
    torch_tpu.dynamic.set_mode(before)


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   attn_implementation="sdpa")
    cpu = transformers.LlamaForCausalLM(cfg)
    return cpu, copy.deepcopy(cpu).to("tpu")


def _compiles() -> int:
    s = torch_tpu.debug.stats()
    return s["compiles"] + s.get("disk_hits", 0)


def _forward_per_length(compiled, cpu, lengths):
    """Per length: (graphs traced, bucket modules built, executables compiled)."""
    counts = []
    for n in lengths:
        ids = torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(n))
        tpu_compile.reset_stats()
        before = _compiles()
        with torch.no_grad():
            got = compiled(ids.to("tpu")).logits.cpu()
            want = cpu(ids).logits
        torch.testing.assert_close(got, want, **TOL)
        s = tpu_compile.stats()
        assert s["fallback_graphs"] == 0 and s["exact_shape_graphs"] == 0, (n, s, tpu_compile.symbolic_fallbacks())
        counts.append((s["graphs"], s["bucket_modules"], _compiles() - before))
    return counts


def test_dynamic_true_new_prompt_lengths_compile_nothing():
    cpu, dev = _llama()
    cpu.eval(), dev.eval()
    counts = _forward_per_length(torch.compile(dev, backend="tpu", dynamic=True), cpu, [9, 10, 13, 14])
    graphs, modules, compiles = counts[0]
    assert (graphs, modules) == (1, 1) and compiles >= 1, counts
    assert counts[1:] == [(0, 0, 0)] * 3, counts


def test_automatic_dynamic_new_prompt_lengths_compile_nothing():
    # Dynamo compiles the first length static; the second makes the sequence
    # length symbolic: one bucketed graph, then nothing for 13 and 14.
    cpu, dev = _llama()
    cpu.eval(), dev.eval()
    counts = _forward_per_length(torch.compile(dev, backend="tpu"), cpu, [9, 10, 13, 14])
    assert counts[0][:2] == (1, 0), counts
    assert counts[1][:2] == (1, 1), counts
    assert counts[2:] == [(0, 0, 0)] * 2, counts


def test_dynamic_true_training_step_equals_cpu():
    # Forward with the loss and backward: the loss flattens [batch, length]
    # into rows (a merge XLA's padder cannot follow), so these graphs run one
    # module per shape, each specialized to the float inputs' values; what
    # matters here is that they are correct.
    cpu, dev = _llama()
    compiled = torch.compile(dev, backend="tpu", dynamic=True)
    for n in (9, 10):
        ids = torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(n))
        cpu.zero_grad(), dev.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "runs a graph eagerly": the first call's backward
            loss = compiled(ids.to("tpu"), labels=ids.to("tpu")).loss
            loss.backward()
        want = cpu(ids, labels=ids).loss
        want.backward()
        torch.testing.assert_close(loss.cpu(), want, **TOL)
        for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                     "model.layers.1.mlp.down_proj.weight"):
            got_grad = dev.get_parameter(name).grad.cpu()
            torch.testing.assert_close(got_grad, cpu.get_parameter(name).grad, **TOL, msg=name)


def test_float_argument_is_a_value_of_the_module():
    # dynamic=True passes a Python float as a 0-d CPU tensor the graph
    # converts: computed in the module, so a new value compiles nothing.
    def f(x, eps):
        return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * x

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    x = torch.randn(3, 16)
    for k, eps in enumerate((1e-5, 1e-3, 0.5)):
        before = _compiles()
        torch.testing.assert_close(compiled(x.to("tpu"), eps).cpu(), f(x, eps), **TOL)
        if k:
            assert _compiles() == before, eps
    s = tpu_compile.stats()
    assert s["fallback_graphs"] == 0 and s["native_graphs"] >= 1, s


def test_a_float_argument_saved_for_backward_is_correct():
    # The forward graph hands the 0-d CPU value to the backward graph: a
    # device module may not return it (it would come back on tpu), so that
    # graph runs op by op, with a warning; gradients equal CPU's.
    def f(x, eps):
        return (torch.sin(x) * eps).sum()

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for eps in (0.25, 0.75):
        x = torch.randn(5, requires_grad=True)
        xd = x.detach().to("tpu").requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(xd, eps).backward()
        f(x, eps).backward()
        assert xd.grad.device.type == "tpu"
        torch.testing.assert_close(xd.grad.cpu(), x.grad, **TOL)
