"""torch.autocast(device_type="tpu"): CUDA's op lists on the AutocastPrivateUse1
key, bfloat16 by default, checked against CPU autocast."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch_tpu

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

BF16_TOL = {"rtol": 1.6e-2, "atol": 1e-2}


@pytest.fixture(autouse=True)
def _amp_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.autocast asks the device module for get_amp_supported_dtype()."""
    torch.manual_seed(1234)
    if not hasattr(torch.tpu, "get_amp_supported_dtype"):
        # Not provided by torch_tpu.device yet: supply it for these tests.
        monkeypatch.setattr(torch.tpu, "get_amp_supported_dtype",
                            lambda: [torch.bfloat16, torch.float16], raising=False)


def _fallbacks() -> dict[str, int]:
    return dict(torch_tpu.debug.stats()["fallbacks"])


def _new_fallbacks(before: dict[str, int]) -> set[str]:
    return {k for k, v in _fallbacks().items() if v != before.get(k, 0)}


def test_autocast_available_and_default_dtype() -> None:
    assert torch.amp.autocast_mode.is_autocast_available("tpu")
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    assert torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.AutocastPrivateUse1)
    with torch.autocast("tpu"):
        assert torch.is_autocast_enabled("tpu")
        assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("tpu")


def test_lower_precision_ops() -> None:
    x = torch.randn(4, 8, device="tpu")
    w = torch.randn(8, 8, device="tpu")
    lin = torch.nn.Linear(8, 6).to("tpu")
    before = _fallbacks()
    with torch.autocast("tpu", dtype=torch.bfloat16):
        outs = {
            "linear": lin(x),
            "matmul": x @ w,
            "mm": torch.mm(x, w),
            "addmm": torch.addmm(x, x, w),
            "bmm": torch.bmm(x[None], w[None]),
            "baddbmm": torch.baddbmm(x[None], x[None], w[None]),
            "einsum": torch.einsum("ij,jk->ik", x, w),
        }
    for name, y in outs.items():
        assert y.dtype == torch.bfloat16, name
    assert not _new_fallbacks(before)
    # same values as CPU autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = lin.cpu()(x.cpu())
    torch.testing.assert_close(outs["linear"].cpu(), expected, **BF16_TOL)


def test_fp32_ops_stay_fp32() -> None:
    x = torch.randn(4, 8, device="tpu")
    w = torch.randn(8, 8, device="tpu")
    target = torch.randint(0, 8, (4,), device="tpu")
    before = _fallbacks()
    with torch.autocast("tpu"):
        y = x @ w  # bfloat16
        assert y.dtype == torch.bfloat16
        outs = {
            "softmax": F.softmax(y, -1),
            "log_softmax": F.log_softmax(y, -1),
            "layer_norm": F.layer_norm(y, (8,)),
            "exp": y.exp(),
            "log1p": y.abs().log1p(),
            "sum": y.sum(),
            "cumsum": y.cumsum(0),
            "mse_loss": F.mse_loss(y, x),
            "cross_entropy": F.cross_entropy(y, target),
            "norm": torch.linalg.vector_norm(y),
        }
        unlisted = {"relu": y.relu(), "add": y + y}
        promoted = torch.atan2(y, x)
    for name, out in outs.items():
        assert out.dtype == torch.float32, name
    for name, out in unlisted.items():
        assert out.dtype == torch.bfloat16, name
    assert promoted.dtype == torch.float32
    assert not _new_fallbacks(before)


def test_float16_and_disabled_regions() -> None:
    x = torch.randn(4, 8, device="tpu")
    with torch.autocast("tpu", dtype=torch.float16):
        assert (x @ x.T).dtype == torch.float16
        with torch.autocast("tpu", enabled=False):
            assert (x @ x.T).dtype == torch.float32
    assert (x @ x.T).dtype == torch.float32
    # CPU tensors are not affected by tpu autocast
    with torch.autocast("tpu"):
        assert (x.cpu() @ x.cpu().T).dtype == torch.float32


def test_binary_cross_entropy_is_banned() -> None:
    p = torch.rand(4, device="tpu")
    t = torch.rand(4, device="tpu")
    with torch.autocast("tpu"):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, t)
        assert F.binary_cross_entropy_with_logits(p, t).dtype == torch.float32


def _training_step(device: str) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 32), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 10))
    x = torch.randn(8, 16)
    target = torch.randint(0, 10, (8,))
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=device != "cpu")
    with torch.autocast(device, dtype=torch.bfloat16):
        logits = model(x.to(device))
        loss = F.cross_entropy(logits, target.to(device))
    loss.backward()
    grads = [p.grad.cpu() for p in model.parameters()]
    opt.step()
    return loss.detach().cpu(), grads, [p.detach().cpu() for p in model.parameters()]


def test_training_step_matches_cpu_autocast() -> None:
    exp_loss, exp_grads, exp_params = _training_step("cpu")
    before = _fallbacks()
    loss, grads, params = _training_step("tpu")
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, exp_loss, **BF16_TOL)
    for g, e in zip(grads, exp_grads):
        assert g.dtype == torch.float32  # master weights and their grads stay f32
        torch.testing.assert_close(g, e, rtol=5e-2, atol=2e-2)
    for p, e in zip(params, exp_params):
        torch.testing.assert_close(p, e, rtol=5e-2, atol=1e-2)
    assert not _new_fallbacks(before), sorted(_new_fallbacks(before))
