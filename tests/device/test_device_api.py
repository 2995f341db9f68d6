"""torch.tpu: the device module, RNG, memory, streams and events, autoload."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_tpu


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=full_env)


# ---------------------------------------------------------------- devices

def test_availability_and_current_device():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    assert torch.tpu.is_initialized()
    assert torch.tpu.get_platform() == "cpu"
    assert torch_tpu.get_platform() == "cpu"


def test_set_device_and_context_manager():
    torch.tpu.set_device(0)
    torch.tpu.set_device("tpu:0")
    torch.tpu.set_device(torch.device("tpu", 0))
    assert torch.tpu.current_device() == 0
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0
        assert torch.zeros(1, device="tpu").device == torch.device("tpu", 0)
    assert torch.tpu.current_device() == 0
    n = torch.tpu.device_count()
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.tpu.set_device(n)
    assert torch.tpu.current_device() == 0
    with pytest.raises(ValueError):
        torch.tpu.set_device("cpu")


def test_synchronize_waits_for_work():
    x = torch.randn(64, 64).to("tpu")
    y = x @ x
    torch.tpu.synchronize()
    torch.tpu.synchronize(0)
    torch.tpu.synchronize("tpu:0")
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())


def test_torch_level_registration():
    assert hasattr(torch.backends, "tpu")
    assert torch.backends.tpu.is_built()
    assert torch.backends.tpu.is_available()
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch.get_device_module("tpu") is torch.tpu
    assert torch._C._get_privateuse1_backend_name() == "tpu"
    assert torch.device("tpu").type == "tpu"
    # generate_methods_for_privateuse1_backend
    t = torch.ones(2).tpu()
    assert t.is_tpu and t.device.type == "tpu"


def test_device_name_and_properties():
    name = torch.tpu.get_device_name()
    assert isinstance(name, str) and name.startswith("cpu")
    assert torch.tpu.get_device_name(0) == name
    props = torch.tpu.get_device_properties(0)
    assert props.name == name
    assert props.platform == "cpu"
    assert props.index == 0
    assert "cpu" in repr(props)


# ---------------------------------------------------------------- RNG

def test_torch_manual_seed_makes_tpu_random_ops_reproducible():
    def draw():
        return [
            torch.randn(3, 5, device="tpu").cpu(),
            torch.rand(7, device="tpu").cpu(),
            torch.randint(0, 100, (9,), device="tpu").cpu(),
            torch.empty(6, device="tpu").normal_(2.0, 3.0).cpu(),
            torch.empty(6, device="tpu").uniform_(-1.0, 1.0).cpu(),
            torch.empty(6, device="tpu").random_(0, 1000).cpu(),
        ]

    torch.manual_seed(1234)
    a = draw()
    torch.manual_seed(1234)
    b = draw()
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    # Consecutive draws differ, and another seed gives other values.
    assert not torch.equal(a[0], torch.randn(3, 5, device="tpu").cpu())
    torch.manual_seed(4321)
    assert not torch.equal(a[0], torch.randn(3, 5, device="tpu").cpu())


def test_tpu_manual_seed_and_initial_seed():
    torch.tpu.manual_seed(7)
    assert torch.tpu.initial_seed() == 7
    a = torch.randn(10, device="tpu").cpu()
    torch.tpu.manual_seed_all(7)
    b = torch.randn(10, device="tpu").cpu()
    assert torch.equal(a, b)
    torch.manual_seed(11)
    assert torch.tpu.initial_seed() == 11
    torch.tpu.seed()
    s = torch.tpu.initial_seed()
    assert s != 11
    x = torch.randn(10, device="tpu").cpu()
    torch.tpu.manual_seed(s)
    assert torch.equal(x, torch.randn(10, device="tpu").cpu())


def test_rng_state_round_trip():
    torch.manual_seed(0)
    torch.randn(4, device="tpu")  # advance
    state = torch.tpu.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    a = torch.randn(16, device="tpu").cpu()
    b = torch.rand(5, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(16, device="tpu").cpu(), a)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), b)
    states = torch.tpu.get_rng_state_all()
    assert len(states) == torch.tpu.device_count()


def test_explicit_tpu_generator():
    g = torch.Generator(device="tpu")
    assert g.device.type == "tpu"
    g.manual_seed(5)
    a = torch.randn(8, device="tpu", generator=g).cpu()
    g.manual_seed(5)
    b = torch.randn(8, device="tpu", generator=g).cpu()
    assert torch.equal(a, b)
    # The explicit generator does not touch the default one.
    torch.manual_seed(5)
    c = torch.randn(8, device="tpu").cpu()
    g.manual_seed(5)
    torch.randn(8, device="tpu", generator=g)
    torch.manual_seed(5)
    assert torch.equal(torch.randn(8, device="tpu").cpu(), c)


def test_random_values_are_plausible():
    torch.manual_seed(3)
    x = torch.randn(20000, device="tpu").cpu()
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05
    u = torch.rand(20000, device="tpu").cpu()
    assert 0 <= u.min().item() and u.max().item() < 1 and abs(u.mean().item() - 0.5) < 0.02


# ---------------------------------------------------------------- memory

def test_memory_accounting():
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base
    x = torch.empty(1000, device="tpu")
    y = torch.empty(250, dtype=torch.float64, device="tpu")
    assert torch.tpu.memory_allocated() == base + 4000 + 2000
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == base + 6000
    del x, y
    assert torch.tpu.memory_allocated() == base
    assert torch.tpu.max_memory_allocated() >= base + 6000
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base
    s = torch.tpu.memory_stats()
    assert s["allocation.all.allocated"] >= s["allocation.all.freed"]
    torch.tpu.empty_cache()
    assert torch.tpu.memory_allocated() == base


def test_accelerator_memory_api():
    torch.tpu.synchronize()
    base = torch.accelerator.memory_allocated()
    assert base == torch.tpu.memory_allocated()
    torch.accelerator.reset_peak_memory_stats()
    x = torch.empty(2048, device="tpu")
    assert torch.accelerator.memory_allocated() == base + 8192
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == base + 8192
    del x
    assert torch.accelerator.memory_allocated() == base
    assert torch.accelerator.max_memory_allocated() == base + 8192
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == base
    torch.accelerator.empty_cache()


# ---------------------------------------------------------------- streams and events

def test_streams():
    s = torch.tpu.current_stream()
    assert s.device == torch.device("tpu", 0)
    assert isinstance(s, torch.Stream)
    assert torch.tpu.default_stream().device_index == 0
    x = torch.ones(8, device="tpu") * 3
    s.synchronize()
    assert s.query()
    with torch.tpu.stream(torch.tpu.Stream()):
        y = x + 1
    assert torch.equal(y.cpu(), torch.full((8,), 4.0))


def test_record_stream_is_native():
    # diffusers' group offloading (record_stream=True) calls it on onloaded weights.
    torch_tpu.debug.reset_stats()
    x = torch.randn(4, 4).to("tpu")
    x.record_stream(torch.tpu.current_stream())
    x.data.record_stream(torch.Stream(device="tpu"))
    assert torch_tpu.debug.stats()["fallbacks"].get("aten::record_stream", 0) == 0
    assert torch.equal((x * 2).cpu(), x.cpu() * 2)
    with pytest.raises(RuntimeError, match="record_stream"):
        x.record_stream(torch.Stream(device="cpu"))


def test_event_timing():
    start = torch.tpu.Event(enable_timing=True)
    end = torch.tpu.Event(enable_timing=True)
    x = torch.randn(128, 128).to("tpu")
    start.record()
    for _ in range(3):
        x = torch.tanh(x @ x)
    end.record()
    end.synchronize()
    assert end.query()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms >= 0
    # Plain torch.Event on tpu times too.
    a = torch.Event(device="tpu", enable_timing=True)
    b = torch.Event(device="tpu", enable_timing=True)
    a.record()
    b.record()
    assert a.elapsed_time(b) >= 0


# ---------------------------------------------------------------- processes

def test_autoload_one_liner_without_importing_torch_tpu():
    out = _run("import torch; print(torch.randn(2, 3, device='tpu').sum().item())")
    assert out.returncode == 0, out.stderr
    float(out.stdout.strip().splitlines()[-1])


def test_two_cpu_devices():
    out = _run("""
        import torch
        assert torch.tpu.device_count() == 2, torch.tpu.device_count()
        a = torch.arange(6.0, device="tpu:1")
        b = a * 2 + 1
        assert b.device == torch.device("tpu", 1), b.device
        assert torch.equal(b.cpu(), torch.arange(6.0) * 2 + 1)
        c = b.to("tpu:0")
        assert c.device == torch.device("tpu", 0)
        assert torch.equal(c.cpu(), b.cpu())
        d = c.to("tpu:1")
        assert torch.equal((d + a).cpu(), torch.arange(6.0) * 3 + 1)
        e = torch.empty(6, device="tpu:1")
        e.copy_(c)
        assert e.device.index == 1 and torch.equal(e.cpu(), c.cpu())
        with torch.tpu.device(1):
            assert torch.tpu.current_device() == 1
            assert torch.zeros(2, device="tpu").device.index == 1
        assert torch.tpu.current_device() == 0
        try:
            a + c
        except RuntimeError as err:
            assert "device" in str(err)
        else:
            raise AssertionError("tpu:1 + tpu:0 did not raise")
        torch.manual_seed(0)
        r0 = torch.randn(5, device="tpu:1").cpu()
        torch.manual_seed(0)
        assert torch.equal(r0, torch.randn(5, device="tpu:1").cpu())
        print("OK")
        """, TORCH_TPU_CPU_DEVICES="2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "OK"


def test_pjrt_create_options_from_env():
    # A typed plugin create option from TORCH_TPU_PJRT_OPTIONS overrides ours.
    out = _run("import torch; print(torch.tpu.device_count())",
               TORCH_TPU_PJRT_OPTIONS="cpu_device_count=3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "3"
    bad = _run("import torch; torch.zeros(1, device='tpu')",
               TORCH_TPU_PJRT_OPTIONS="cpu_device_count")
    assert bad.returncode != 0
    assert "TORCH_TPU_PJRT_OPTIONS: expected name=value" in bad.stderr
