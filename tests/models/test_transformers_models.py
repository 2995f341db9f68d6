"""Transformers models on "tpu": forward and one AdamW step, equal to CPU, no CPU fallback.

For each model family (tiny config, random weights, float32; see
``torch_tpu.tools.tiny_models``) the same model and inputs run on CPU and on
tpu: forward to a loss, ``loss.backward()``, one ``torch.optim.AdamW(lr=1e-3)``
step. The whole tpu run must not touch the CPU fallback. Compared:

* loss and the model's outputs (logits, embeddings): rtol 1e-4, atol 1e-5;
* every gradient: rtol 1e-4, atol 1e-5;
* every parameter after the step: AdamW's first step moves an element by
  ``lr * g / (|g| + eps)``, i.e. about ``lr * sign(g)``, so where ``g`` is
  rounding noise around 0 (key biases, whose exact gradient is 0 because
  softmax ignores a constant shift) CPU and tpu may step in opposite
  directions. So (a) against the CPU model wherever ``|g| > 1e-5`` (most
  elements; at least half is asserted) with rtol 1e-5, atol 5e-7 (0.05% of a
  step), and (b) every element against a CPU AdamW step fed tpu's gradients,
  rtol 1e-6, atol 1e-7.

Measured on XLA:CPU: outputs within 1.3e-6, gradients within 5e-6 (clip's
token embedding, gradients up to 4), parameters within 6e-8 and 1.5e-8.
"""
from __future__ import annotations

import copy

import pytest
import torch

import torch_tpu
from torch_tpu.tools import tiny_models

LR = 1e-3
OUT_TOL = dict(rtol=1e-4, atol=1e-5)
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)
PARAM_TOL = dict(rtol=1e-5, atol=5e-7)
STEP_TOL = dict(rtol=1e-6, atol=1e-7)
WELL_CONDITIONED = 1e-5  # |grad| above which the first AdamW step is a smooth function of grad
# ops a model must have run natively: its distinctive path really ran on tpu
KEY_OPS = {
    "qwen3_moe": {"histc", "_grouped_mm"},  # Transformers' default "grouped_mm" experts
    "vit": {"convolution", "convolution_backward"},
    "whisper": {"convolution", "convolution_backward"},
    "clip": {"convolution", "convolution_backward"},
}


def _train_step(model, inputs):
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out = model(**inputs)
    out.loss.backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    return out, grads


def _reference_step(init, grads):
    """A CPU AdamW step from the initial parameters with the given gradients."""
    params = {n: init[n].clone().requires_grad_() for n in grads}
    for n, p in params.items():
        p.grad = grads[n].clone()
    torch.optim.AdamW(list(params.values()), lr=LR).step()
    return {n: p.detach() for n, p in params.items()}


@pytest.mark.parametrize("name", list(tiny_models.MODELS))
def test_forward_and_adamw_step_match_cpu_without_fallbacks(name):
    cpu, inputs = tiny_models.make(name, seed=0)
    dev = copy.deepcopy(cpu).to("tpu")
    init = {n: p.detach().clone() for n, p in cpu.named_parameters()}
    # .to("tpu") keeps Parameters (and so tied weights) as they are, like cuda
    assert len(list(dev.parameters())) == len(list(cpu.parameters()))

    torch_tpu.debug.reset_stats()
    out_tpu, grads_tpu = _train_step(dev, tiny_models.to(inputs, "tpu"))
    torch.tpu.synchronize()
    stats = torch_tpu.debug.stats()
    assert stats["fallbacks"] == {}, f"{name}: CPU fallbacks {stats['fallbacks']}"
    assert sum(stats["native_ops"].values()) > 100
    assert KEY_OPS.get(name, set()) <= set(stats["native_ops"]), sorted(stats["native_ops"])

    out_cpu, grads_cpu = _train_step(cpu, inputs)

    assert torch.isfinite(out_cpu.loss) and out_cpu.loss.item() > 0
    for field in ("loss",) + tiny_models.MODELS[name].outputs:
        got, want = getattr(out_tpu, field), getattr(out_cpu, field)
        assert got.device.type == "tpu", field
        torch.testing.assert_close(got.detach().cpu(), want.detach(), **OUT_TOL, msg=lambda m: f"{field}: {m}")

    assert grads_tpu.keys() == grads_cpu.keys()
    trainable = [n for n, p in cpu.named_parameters() if p.requires_grad]
    assert sorted(grads_cpu) == sorted(trainable), "every trainable parameter gets a gradient"
    for n, g in grads_cpu.items():
        torch.testing.assert_close(grads_tpu[n], g, **GRAD_TOL, msg=lambda m: f"grad of {n}: {m}")

    after_tpu = {n: p.detach().cpu() for n, p in dev.named_parameters()}
    after_cpu = {n: p.detach() for n, p in cpu.named_parameters()}
    reference = _reference_step(init, grads_tpu)
    compared = total = 0
    for n in trainable:
        got, want = after_tpu[n], after_cpu[n]
        assert not torch.equal(got, init[n]), f"{n} did not move"
        torch.testing.assert_close(got, reference[n], **STEP_TOL, msg=lambda m: f"AdamW step of {n}: {m}")
        mask = grads_cpu[n].abs() > WELL_CONDITIONED
        torch.testing.assert_close(got[mask], want[mask], **PARAM_TOL, msg=lambda m: f"{n} after the step: {m}")
        compared += int(mask.sum())
        total += want.numel()
    for n, p in cpu.named_parameters():
        if not p.requires_grad:
            assert torch.equal(after_tpu[n], init[n]), f"frozen {n} changed"
    assert compared >= total // 2, f"only {compared} of {total} parameter elements compared"


def test_to_tpu_keeps_parameters_and_tied_weights():
    """`module.to("tpu")` moves each Parameter in place (`param.data = ...`), like
    cuda: tied weights stay one Parameter and an optimizer made before still
    holds the model's parameters."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    before = list(model.parameters())
    model.to("tpu")
    assert model[1].weight is model[0].weight and model[0].weight is before[0]
    assert model[0].weight.device.type == "tpu" and isinstance(model[0].weight, torch.nn.Parameter)
    model(torch.tensor([1, 2], device="tpu")).sum().backward()
    assert model[0].weight.grad.device.type == "tpu"
    model.to("cpu")
    assert model[0].weight is before[0] and model[0].weight.device.type == "cpu"
    assert model[0].weight.grad.device.type == "cpu"


@pytest.mark.parametrize("form", ["tensor_scalar", "scalar_tensor"])
def test_where_with_a_python_scalar_is_differentiable(form):
    """where(cond, x, 0.0) / where(cond, 0.0, x) (CompositeImplicitAutograd) keep
    their gradient on tpu: no tpu kernel hides them from autograd."""
    x = torch.randn(6, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    for t in (x, xt):
        y = torch.where(t > 0, t, 0.0) if form == "tensor_scalar" else torch.where(t > 0, 0.5, t)
        (y * torch.arange(6.0, device=t.device)).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=0, atol=0)


def test_coverage_tool_knows_the_tiny_models(capsys):
    from torch_tpu.tools import coverage

    assert coverage.main(["--model", "mistral", "--fail-on-fallback"]) == 0
    out = capsys.readouterr().out
    assert "mm" in out and "0 ops through the CPU fallback (0 calls)" in out
    with pytest.raises(SystemExit, match="qwen3_moe"):
        coverage.main(["--model", "no_such_model"])
