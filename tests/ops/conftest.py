"""Shared fixtures for the op tests: the OpInfo result table.

test_opinfo.py records one row per (op, dtype) into a session-wide table;
pytest_terminal_summary prints it at the end of the run (no -s needed).
"""
from __future__ import annotations

from typing import Any

import pytest

OPINFO_RESULTS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def opinfo_results(request: pytest.FixtureRequest) -> dict[tuple[str, str], dict[str, Any]]:
    """(op id, dtype) -> {"passed", "total", "skipped", "fallback", "fallback_ops", "failed"}."""
    return request.config.stash.setdefault(OPINFO_RESULTS, {})


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    results = config.stash.get(OPINFO_RESULTS, None)
    if not results:
        return
    tr = terminalreporter
    tr.section("torch_tpu OpInfo sweep")
    tr.write_line(f"{'op':<36} {'dtype':<9} {'passed':>9} {'skipped':>8} {'native':<10} fallbacks")
    n_rows = n_native = n_pass = 0
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
    tr.write_line(f"{n_rows} (op, dtype) pairs: {n_pass} all samples pass "
                  f"({100.0 * n_pass / n_rows:.0f}%), {n_native} fully native "
                  f"({100.0 * n_native / n_rows:.0f}%)")
