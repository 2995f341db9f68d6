"""The op_db sweep tool (python -m torch_tpu.tools.opdb_sweep) end to end, on a few entries.

The full sweep is a separate slow command (README); this keeps the tool from rotting:
one worker run over three entries covering its comparison paths (values, random, sparse),
the verdicts of wrong and raising ops, and the isolation of a crashing or hanging worker
(a fake worker, so without the cost of importing torch again).
"""
import copy
import json
import subprocess
import sys

import pytest
import torch

from torch_tpu.tools import _opdb_worker, opdb_sweep


def _by_id(name):
    from torch.testing._internal.common_methods_invocations import op_db
    return next(o for o in op_db if o.name == name and not o.variant_test_name)


def test_sweep_three_entries_end_to_end(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert opdb_sweep.main(["--ops", "add,rand_like,to_sparse", "--dtypes", "float32",
                            "--samples", "2", "--json", str(out), "--quiet"]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"add:float32:forward", "add:float32:backward", "rand_like:float32:forward",
                            "to_sparse:float32:forward",
                            "to_sparse:float32:backward"}
    add = results["add:float32:forward"]
    assert (add["status"], add["native"], add["checked"], add["fallback_ops"]) == ("pass", True, 2, [])
    assert results["add:float32:backward"]["status"] == "pass"
    assert results["rand_like:float32:forward"]["status"] == "pass"
    assert results["rand_like:float32:forward"]["why"] == "random"
    assert results["to_sparse:float32:forward"]["status"] == "sparse"
    table = capsys.readouterr().out
    assert "forward   float32" in table and "backward  float32" in table
    # --resume with everything done runs nothing and keeps the results.
    assert opdb_sweep.main(["--ops", "add", "--dtypes", "float32", "--json", str(out), "--resume",
                            "--quiet"]) == 0
    assert json.loads(out.read_text())["results"] == results
    rows = {(r["dir"], r["dtype"]): r for r in opdb_sweep.summarize(results)}
    assert rows[("forward", "float32")]["entries"] == 2 and rows[("forward", "float32")]["sparse"] == 1


def test_wrong_and_raising_ops_are_fail_and_error():
    add = _by_id("add")
    wrong = copy.copy(add)
    wrong.op = lambda x, *a, **k: torch.add(x, *a, **k) + (1 if x.device.type == "tpu" else 0)
    r = _opdb_worker.run_task(wrong, "float32", "forward", 2)
    assert r["status"] == "fail" and "not close" in r["why"], r

    def tpu_raises(x, *a, **k):
        if x.device.type == "tpu":
            raise RuntimeError("boom on tpu")
        return torch.add(x, *a, **k)
    raising = copy.copy(add)
    raising.op = tpu_raises
    r = _opdb_worker.run_task(raising, "float32", "forward", 2)
    assert r["status"] == "error" and "boom on tpu" in r["why"], r


@pytest.mark.parametrize("behaviour,why", [("import os; os.abort()", "worker crashed"),
                                           ("import time; time.sleep(30)", "timeout")])
def test_a_crashing_or_hanging_entry_does_not_stop_the_sweep(monkeypatch, tmp_path, behaviour, why):
    """The first task kills (or hangs) its worker: it is recorded as an error and the
    next task runs in a fresh worker."""
    def fake_worker(tasks, args):
        first = ":".join(tasks[0])
        if first == "bad:float32:forward":
            code = f"print('@@opdb start {first}', flush=True); {behaviour}"
        else:
            result = {"key": first, "op": tasks[0][0], "dtype": "float32", "dir": "forward",
                      "status": "pass", "native": True, "why": "", "fallback_ops": [], "checked": 1,
                      "passed": 1}
            code = f"print('@@opdb start {first}'); print('@@opdb result ' + {json.dumps(result)!r})"
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    monkeypatch.setattr(opdb_sweep, "_start_worker", fake_worker)
    args = opdb_sweep.argparse.Namespace(timeout=2.0, chunk=10, json=None, quiet=True)
    results = {}
    opdb_sweep._sweep([["bad", "float32", "forward"], ["good", "float32", "forward"]], results, args)
    assert results["bad:float32:forward"]["status"] == "error"
    assert why in results["bad:float32:forward"]["why"]
    assert results["good:float32:forward"]["status"] == "pass"


def test_backward_sample_with_a_view_already_on_tpu():
    # lu_solve's third sample has pivots that are a view into a larger storage; the backward
    # sweep moves leaves first, and re-moving that tpu view raised "set the storage of a
    # tensor on device cpu to a storage on ... tpu:0" (counted as an lu_solve error).
    r = _opdb_worker.run_task(_by_id("lu_solve"), "float32", "backward", 4)
    assert (r["status"], r["native"], r["checked"]) == ("pass", True, 4), r
    v = torch.arange(6.0).to("tpu")[::2]
    assert _opdb_worker._view_to_tpu(v) is v
