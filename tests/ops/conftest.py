"""Shared fixtures for the op tests: the OpInfo result table.

test_opinfo.py (forward) and test_opinfo_grad.py (backward) record one row per
(op, dtype) into session-wide tables; pytest_terminal_summary prints them at the
end of the run (no -s needed). TORCH_TPU_OPINFO_DUMP=file.json also writes the
tables as JSON (to regenerate the EXPECTED lists).
"""
from __future__ import annotations

import json
import os
from typing import Any

import pytest

OPINFO_RESULTS = pytest.StashKey[dict]()
OPINFO_GRAD_RESULTS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def opinfo_results(request: pytest.FixtureRequest) -> dict[tuple[str, str], dict[str, Any]]:
    """(op id, dtype) -> {"passed", "total", "skipped", "fallback", "fallback_ops", "failed"}."""
    return request.config.stash.setdefault(OPINFO_RESULTS, {})


@pytest.fixture(scope="session")
def opinfo_grad_results(request: pytest.FixtureRequest) -> dict[tuple[str, str], dict[str, Any]]:
    """Same rows as opinfo_results, for the backward sweep."""
    return request.config.stash.setdefault(OPINFO_GRAD_RESULTS, {})


def _write_table(tr: Any, title: str, results: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    tr.section(title)
    tr.write_line(f"{'op':<36} {'dtype':<9} {'passed':>9} {'skipped':>8} {'native':<10} fallbacks")
    n_rows = n_native = n_pass = 0
    dump = {}
    for (op, dtype), r in sorted(results.items()):
        checked = r["total"] - r["skipped"]
        if r["fallback"] == 0:
            native = "yes"
        elif r["fallback"] == checked:
            native = "no"
        else:
            native = f"{checked - r['fallback']}/{checked}"
        fb = ",".join(sorted(r["fallback_ops"]))
        tr.write_line(f"{op:<36} {dtype:<9} {r['passed']:>4}/{checked:<4} {r['skipped']:>8} "
                      f"{native:<10} {fb}")
        n_rows += 1
        n_native += native == "yes"
        n_pass += checked > 0 and r["passed"] == checked
        dump[f"{op}:{dtype}"] = {"passed": r["passed"], "checked": checked, "native": native == "yes",
                                 "fallback_ops": sorted(r["fallback_ops"]), "failed": r["failed"][:3]}
    tr.write_line(f"{n_rows} (op, dtype) pairs: {n_pass} all samples pass "
                  f"({100.0 * n_pass / n_rows:.0f}%), {n_native} fully native "
                  f"({100.0 * n_native / n_rows:.0f}%)")
    return dump


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    dump = {}
    for key, title, name in ((OPINFO_RESULTS, "torch_tpu OpInfo sweep (forward)", "forward"),
                             (OPINFO_GRAD_RESULTS, "torch_tpu OpInfo sweep (backward)", "backward")):
        results = config.stash.get(key, None)
        if results:
            dump[name] = _write_table(terminalreporter, title, results)
    path = os.environ.get("TORCH_TPU_OPINFO_DUMP")
    if path and dump:
        with open(path, "w") as f:
            json.dump(dump, f, indent=1)
