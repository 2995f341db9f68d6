"""pytest plugin loaded by run_transformers.py (``-p _conformance_plugin``).

Appends one JSON line per finished test (and per failed collection) to the
file named by ``CONFORMANCE_RESULTS``, as soon as the test finishes, so the
results survive a module that is killed by its timeout.
"""

import json
import os

_PATH = os.environ.get("CONFORMANCE_RESULTS")
_state = {}


def _write(rec):
    if not _PATH:
        return
    with open(_PATH, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def _msg(report):
    if not report.failed:
        return ""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0][:300] if crash.message else ""
    return str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""


def pytest_runtest_logstart(nodeid, location):
    # A test that starts and never finishes (module timeout, hard crash) is
    # reported as an error by the runner.
    _write({"nodeid": nodeid, "outcome": "started", "message": "", "duration": 0.0})


def pytest_runtest_logreport(report):
    st = _state.setdefault(report.nodeid, {"outcome": None, "message": "", "duration": 0.0})
    st["duration"] += getattr(report, "duration", 0.0) or 0.0
    xfail = hasattr(report, "wasxfail")
    if report.when == "setup":
        if report.failed:
            st["outcome"], st["message"] = "error", _msg(report)
        elif report.skipped:
            st["outcome"] = "skipped"
    elif report.when == "call":
        if xfail:
            st["outcome"] = "skipped" if report.skipped else "passed"
        elif report.passed:
            st["outcome"] = "passed"
        elif report.failed:
            st["outcome"], st["message"] = "failed", _msg(report)
        elif report.skipped:
            st["outcome"] = "skipped"
    elif report.when == "teardown":
        if report.failed and st["outcome"] in (None, "passed"):
            st["outcome"], st["message"] = "error", _msg(report)
        _write({"nodeid": report.nodeid, "outcome": st["outcome"] or "error",
                "message": st["message"], "duration": round(st["duration"], 3)})
        _state.pop(report.nodeid, None)


def pytest_collectreport(report):
    if report.failed:
        _write({"nodeid": report.nodeid, "outcome": "collection_error",
                "message": _msg(report), "duration": 0.0})
