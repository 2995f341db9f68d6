"""torch.profiler on tpu: device executions, compiles and transfers next to
the host events, in the exported Chrome trace."""
import json

import pytest
import torch
import torch_tpu
from torch.profiler import ProfilerActivity, profile, record_function


def training_step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def make_model():
    # Sizes no other test uses: the first step must compile.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(29, 43), torch.nn.Tanh(),
                                torch.nn.Linear(43, 7)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(13, 29).to("tpu"), torch.randn(13, 7).to("tpu")
    return model, opt, x, y


def host_range(events, name):
    [e] = [e for e in events if e.get("ph") == "X" and e["name"] == name]
    return e["ts"], e["ts"] + e["dur"]


@pytest.mark.parametrize("tpu_activity", ["PrivateUse1", "TPU"])
def test_trace_of_a_training_step(tmp_path, tpu_activity):
    model, opt, x, y = make_model()
    activities = [ProfilerActivity.CPU, getattr(ProfilerActivity, tpu_activity)]
    # Exact shapes: under "auto", signatures other tests made dynamic re-lay x
    # into a padded buffer during step 1, and step 2's exact addmm compiles
    # once for that layout; this test is about the trace, not that policy.
    with profile(activities=activities) as prof, torch_tpu.dynamic.dynamic_shapes("0"):
        with record_function("step1"):
            training_step(model, opt, x, y)
            torch.tpu.synchronize()
        with record_function("step2"):
            loss = training_step(model, opt, x, y)
            torch.tpu.synchronize()
    loss.cpu()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    step1, step2 = host_range(events, "step1"), host_range(events, "step2")
    device = [e for e in events if e.get("cat") == "kernel"]
    compiles = [e for e in events if e.get("cat") == "tpu_compile"]
    host_ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert host_ops and device

    def within(e, r, slack=1e3):  # us; device spans end when outputs are ready
        return r[0] - slack <= e["ts"] and e["ts"] + e["dur"] <= r[1] + slack

    # Device spans for the matmuls of each step (2 forward, 3 backward).
    for r in (step1, step2):
        matmuls = [e for e in device if within(e, r) and e["name"].split(".")[0] in ("mm", "addmm")]
        assert len(matmuls) >= 5, sorted({e["name"] for e in device if within(e, r)})
        assert all(e["pid"] == 0 and e["dur"] >= 0 for e in matmuls)
    if tpu_activity == "PrivateUse1":  # first in this process: the first step compiles
        assert any(within(e, step1) for e in compiles)
        assert any(e["name"].startswith("addmm") for e in compiles), {e["name"] for e in compiles}
    assert not any(within(e, step2) for e in compiles)  # warm
    # Device executions on one device do not overlap (they run in order).
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in device)
    assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:]))
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert any(n.startswith("tpu:0") for n in names), names
    assert torch_tpu.profiler.spans(prof)
    assert "execute" in torch_tpu.profiler.summary(torch_tpu.profiler.spans(prof))


def test_transfers_and_cpu_only_profiles():
    with torch_tpu.profiler.trace() as t:
        a = torch.arange(6.0).to("tpu")
        (a * 3).cpu()
    kinds = {s.kind for s in t.spans}
    assert {"to_device", "to_host", "execute"} <= kinds, kinds
    # A CPU-only profile collects nothing from the runtime.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (a + 1).cpu()
    assert torch_tpu.profiler.spans(prof) == []
    assert torch.tpu.profiler is torch_tpu.profiler
