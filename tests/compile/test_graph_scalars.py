"""Scalars in compiled graphs are runtime parameters (DESIGN.md decision 4):
a graph that differs only in a scalar's value (an lr schedule, a changing
alpha) is the same module and never compiles another executable."""
import torch

import torch_tpu


def _compiles() -> int:
    s = torch_tpu.debug.stats()
    return s["compiles"] + s.get("disk_hits", 0)


def _fresh(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpu")


# Dynamo specializes each new float value (a retrace with the value as a
# constant): exactly the case where baked scalars recompiled every time.
specialized = torch._dynamo.config.patch(automatic_dynamic_shapes=False, cache_size_limit=64)


@specialized
def test_changing_python_scalar_never_recompiles():
    def f(x, a):
        return torch.add(x * a, x, alpha=a / 2) + 1

    compiled = _fresh(f)
    x_cpu = torch.randn(16, 8)
    x = x_cpu.to("tpu")
    torch.testing.assert_close(compiled(x, 0.5).cpu(), f(x_cpu, 0.5))
    before = _compiles()
    for a in (0.25, 0.75, -1.5, 3.0):
        torch.testing.assert_close(compiled(x, a).cpu(), f(x_cpu, a), rtol=1e-6, atol=1e-6)
    assert _compiles() == before  # Dynamo may retrace; XLA compiles nothing


@specialized
def test_lr_schedule_of_a_compiled_optimizer_step_never_recompiles():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    ref = torch.nn.Linear(8, 4)
    ref.load_state_dict(model.state_dict())
    model.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(5, 8)

    @torch.compile(backend="tpu")
    def step():
        opt.step()

    torch._dynamo.reset()
    compiles = []
    for i, lr in enumerate((0.1, 0.05, 0.025, 0.0125)):
        for g, rg in zip(opt.param_groups, ref_opt.param_groups):
            g["lr"] = rg["lr"] = lr
        model(x.to("tpu")).square().sum().backward()
        ref(x).square().sum().backward()
        step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        compiles.append(_compiles())
    for p, rp in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), rp.detach(), rtol=1e-5, atol=1e-6)
    # The first two steps compile (momentum buffers appear at the first);
    # later learning rates reuse the executables.
    assert compiles[3] == compiles[2], compiles
