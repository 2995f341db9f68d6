"""Batch/layer norm's saved statistics: CPU's dtype (the input's, f32 only for
a 16-bit input with f32 parameters) and shape ([0] for batch norm in eval
mode), natively; values equal to CPU's."""
import pytest
import torch
from no_fallback import native

import torch_tpu  # noqa: F401

aten = torch.ops.aten


def _bn_inputs(dtype, param_dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 2, 4, 5, dtype=dtype)
    w, b = torch.randn(2, dtype=param_dtype), torch.randn(2, dtype=param_dtype)
    rm, rv = torch.randn(2, dtype=param_dtype), torch.rand(2, dtype=param_dtype) + 0.5
    return x, w, b, rm, rv


def _check(cpu_outs, tpu_outs):
    for c, t in zip(cpu_outs, tpu_outs):
        assert t.device.type == "tpu"
        assert (t.shape, t.dtype) == (c.shape, c.dtype)
        tol = 2e-2 if c.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(t.cpu(), c, rtol=tol, atol=tol)


CALLS = {
    "native_batch_norm.train": lambda x, w, b, rm, rv: aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5),
    "native_batch_norm.eval": lambda x, w, b, rm, rv: aten.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5),
    "legit.train": lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5),
    "legit.eval": lambda x, w, b, rm, rv: aten._native_batch_norm_legit(x, w, b, rm, rv, False, 0.1, 1e-5),
    "legit.no_stats": lambda x, w, b, rm, rv: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
    "legit_no_training": lambda x, w, b, rm, rv: aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5),
    "with_update": lambda x, w, b, rm, rv: aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5),
    "no_update": lambda x, w, b, rm, rv: aten._batch_norm_no_update(x, w, b, rm, rv, 0.1, 1e-5),
}


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.bfloat16, torch.float32)], ids=["f32", "bf16", "bf16-f32params"])
@pytest.mark.parametrize("name", list(CALLS))
def test_batch_norm_saved_stats_like_cpu(name, dtypes):
    cpu_args = _bn_inputs(*dtypes)
    tpu_args = [t.to("tpu") for t in cpu_args]
    expected = CALLS[name](*cpu_args)
    with native():
        actual = CALLS[name](*tpu_args)
    _check(expected, actual)
    _check(cpu_args[3:], tpu_args[3:])  # running stats, updated in training modes


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.bfloat16, torch.float32)], ids=["f32", "bf16", "bf16-f32params"])
def test_layer_norm_saved_stats_like_cpu(dtypes):
    torch.manual_seed(0)
    x, w = torch.randn(3, 2, 8, dtype=dtypes[0]), torch.randn(8, dtype=dtypes[1])
    expected = aten.native_layer_norm(x, [8], w, w, 1e-5)
    with native():
        actual = aten.native_layer_norm(x.to("tpu"), [8], w.to("tpu"), w.to("tpu"), 1e-5)
    _check(expected, actual)


def test_batch_norm_eval_backward_with_empty_saved_stats():
    m = torch.nn.BatchNorm2d(2).eval()
    x = torch.randn(3, 2, 4, 4, requires_grad=True)
    m(x).square().sum().backward()
    mt = torch.nn.BatchNorm2d(2).eval().to("tpu")
    xt = x.detach().to("tpu").requires_grad_()
    with native():
        mt(xt).square().sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mt.weight.grad.cpu(), m.weight.grad, rtol=1e-5, atol=1e-5)
