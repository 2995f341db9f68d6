"""Background compiles (TORCH_TPU_COMPILE_THREADS, runtime/compile_pool.h and
launch_queue.h): first-seen ops compile on a thread pool while Python keeps
dispatching; their launches are queued and run in dispatch order. Each
scenario runs in a fresh interpreter (the thread count is read once), with
0 (synchronous), 1 and 2 compile threads, and is checked against PyTorch on
the CPU."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

THREADS = ["0", "1", "2"]


def run(script: str, threads: str, **env) -> dict:
    e = dict(os.environ, TORCH_TPU_COMPILE_THREADS=threads, TORCH_TPU_CACHE_DIR="", **env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=e,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


# 40 distinct first-seen ops (each compiles), a chain whose values depend on
# every op before them, with views and in-place ops along the way.
CHAIN = """
    import json, torch, torch_tpu

    def chain(x):
        v = []
        y = x.sin(); v.append(y)
        y = y.cos() + x; v.append(y)
        y = y * 1.5; v.append(y)
        y = y.tanh(); v.append(y)
        y = y.exp(); v.append(y)
        y = y.log1p(); v.append(y)
        y = y.sqrt(); v.append(y)
        y = y.sigmoid(); v.append(y)
        y = y.abs().neg(); v.append(y)
        y = y.clamp(-0.7, 0.3); v.append(y)
        z = y @ x.t(); v.append(z)
        z = z.softmax(-1); v.append(z)
        z = z.cumsum(0); v.append(z)
        z = z.sum(0, keepdim=True) - z; v.append(z)
        z = z.amax(1); v.append(z)
        w = z.reshape(4, 2).transpose(0, 1).contiguous(); v.append(w)
        w = torch.cat([w, w * 2], 0); v.append(w)
        w = w.pow(2).mean(1); v.append(w)
        u = x[1:5, 2:7]; v.append(u.clone())
        u.mul_(3); v.append(x.clone())        # in place through a view
        x.add_(y, alpha=0.5); v.append(x.clone())
        t = x.erf(); v.append(t)
        t = t.atan2(x + 2); v.append(t)
        t = t.floor_divide(0.1); v.append(t)
        t = t.remainder(3.0); v.append(t)
        t = t.max(1).values; v.append(t)
        t = t.sort().values; v.append(t)
        t = t.flip(0).unsqueeze(1).expand(8, 3).contiguous(); v.append(t)
        t = t.square().rsqrt(); v.append(t)
        t = torch.where(t > 0.5, t, -t); v.append(t)
        s = t.norm(); v.append(s)
        s = s + t.std(); v.append(s)
        m = x.lt(0.2).float(); v.append(m)
        m = m.logical_not(); v.append(m)
        m = m.to(torch.int32) * 7 + 1; v.append(m)
        m = m.bitwise_xor(5); v.append(m)
        m = m.argmax(1); v.append(m)
        k = torch.nn.functional.gelu(x); v.append(k)
        k = torch.nn.functional.silu(k).relu(); v.append(k)
        k[0].fill_(2.5); v.append(k)
        return v

    x = torch.randn(8, 10, generator=torch.Generator().manual_seed(0))
    torch_tpu.debug.reset_stats()
    cpu = chain(x.clone())
    tpu = chain(x.to("tpu"))
    got = [t.cpu() for t in tpu]
    bad = [i for i, (a, b) in enumerate(zip(cpu, got))
           if a.dtype != b.dtype or a.shape != b.shape
           or not torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-4, equal_nan=True)]
    s = torch_tpu.debug.stats()
    print("RESULT " + json.dumps({"bad": bad, "n": len(cpu), "compiles": s["compiles"],
                                  "cache_hits": s["cache_hits"], "fallbacks": s["fallbacks"],
                                  "by_op": s["compiles_by_op"]}))
"""


def test_chain_matches_cpu_and_counts_the_same():
    results = {n: run(CHAIN, n) for n in THREADS}
    for n, r in results.items():
        assert r["bad"] == [], f"{n} threads: values differ from CPU at {r['bad']}"
        assert r["n"] == 40
        assert r["compiles"] >= 30, r  # first-seen ops: nearly every one compiles
    base = results["0"]
    for n in ("1", "2"):
        for field in ("compiles", "cache_hits", "fallbacks", "by_op"):
            assert results[n][field] == base[field], (n, field, results[n][field], base[field])


FAILING = """
    import json, torch, torch_tpu
    x = torch.arange(6, dtype=torch.float32, device="tpu")
    a = x.sin()                      # compiles
    err, at = None, None
    try:
        at = "dispatch"
        b = a.cosh()                 # compile fails (injected)
        c = b + 1                    # queued behind the failure
        at = "sync"
        c.cpu()
        at = None
    except RuntimeError as e:
        err = str(e)
    # the process keeps working: the queue is empty again, other ops run
    d = (x * 3).tolist()
    e = a.cpu().tolist()
    err2 = None
    try:
        x.cosh().cpu()               # compiles again, fails again
    except RuntimeError as e2:
        err2 = str(e2)
    torch.tpu.synchronize()
    print("RESULT " + json.dumps({"err": err, "at": at, "err2": err2, "d": d, "e": e}))
"""


@pytest.mark.parametrize("threads", THREADS)
def test_failed_compile_raises_at_sync_point(threads):
    r = run(FAILING, threads, TORCH_TPU_TEST_FAIL_COMPILE="cosh")
    assert r["err"] is not None and "cosh" in r["err"] and "injected compile failure" in r["err"], r
    # synchronous compiles raise at the op; background ones at the next sync point
    assert r["at"] == ("dispatch" if threads == "0" else "sync"), r
    assert r["err2"] is not None and "cosh" in r["err2"], r
    assert r["d"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    import math
    assert r["e"] == pytest.approx([math.sin(i) for i in range(6)], rel=1e-5, abs=1e-6)


SYNC_POINTS = """
    import json, torch, torch_tpu
    base = torch.linspace(-2, 2, 24).reshape(4, 6)
    out = {}
    def steps(x):
        y = x.asinh() * 2
        y[1:3].sub_(y[0])            # view write while compiles are pending
        z = y.t().contiguous().view(-1)[::5]
        return y, z
    cy, cz = steps(base.clone())
    x = base.to("tpu")
    y, z = steps(x)
    out["item"] = abs(z.sum().item() - cz.sum().item()) < 1e-4
    y2, z2 = steps(x)
    out["cpu"] = torch.allclose(y2.cpu(), cy, atol=1e-5)
    y3, z3 = steps(x + 0)
    torch.tpu.synchronize()
    out["sync"] = torch.allclose(z3.to("cpu"), cz, atol=1e-5)
    w = (x.expm1() + 1).amin()
    out["bool"] = bool(w > 0)
    out["print"] = "tensor(" in repr(x.deg2rad())
    print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("threads", THREADS)
def test_sync_points_wait(threads):
    r = run(SYNC_POINTS, threads)
    assert r == {"item": True, "cpu": True, "sync": True, "bool": True, "print": True}, r


FREED = """
    import json, torch, torch_tpu
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    t = x.to("tpu")
    acc = None
    for k in range(6):               # temporaries freed while their writers are queued
        acc = ((t * (k + 1)).tanh() + (t.t() @ t).erf()[0]).sum(1)
    want = None
    for k in range(6):
        want = ((x * (k + 1)).tanh() + (x.t() @ x).erf()[0]).sum(1)
    del t
    print("RESULT " + json.dumps({"ok": torch.allclose(acc.cpu(), want, atol=1e-4)}))
"""


@pytest.mark.parametrize("threads", THREADS)
def test_freed_temporaries(threads):
    assert run(FREED, threads) == {"ok": True}


def test_bad_thread_count_is_a_clear_error():
    e = dict(os.environ, TORCH_TPU_COMPILE_THREADS="two", TORCH_TPU_CACHE_DIR="")
    proc = subprocess.run([sys.executable, "-c", "import torch, torch_tpu\n"
                           "try:\n    (torch.ones(3, device='tpu').sinh()).cpu()\n"
                           "except RuntimeError as e:\n    print('ERR', e)\n"],
                          env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TORCH_TPU_COMPILE_THREADS" in proc.stdout, proc.stdout
