"""What a conformance run needs before it starts, checked in the interpreter
that will run pytest: each missing piece is named with the command that
provides it (without them pytest can die at start-up with 0 tests)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"
INSTALL_TEST_PACKAGES = f"pip install --no-deps -r {REQUIREMENTS}"

# (import name, what provides it). Both suites import these at start-up.
COMMON = [
    ("torch", "pip install torch==2.13.0 (scripts/install.sh)"),
    ("torch_tpu", "pip install . in the torch_tpu checkout (or bash scripts/install.sh)"),
    ("pytest", "pip install pytest==9.0.3"),
    ("parameterized", INSTALL_TEST_PACKAGES),
]
SUITE_MODULES = {
    "transformers": [
        ("timeout_decorator", INSTALL_TEST_PACKAGES),
        # With its dependencies (pyarrow, pandas, dill, ...): not --no-deps.
        ("datasets", "pip install datasets==5.2.0 torch==2.13.0"),
    ],
    "diffusers": [
        # requests-mock is installed with --no-deps: its own dependencies must be there.
        ("requests_mock", INSTALL_TEST_PACKAGES),
        ("requests", INSTALL_TEST_PACKAGES),
        ("six", INSTALL_TEST_PACKAGES),
        ("torchsde", INSTALL_TEST_PACKAGES),
    ],
}

_PROBE = r"""
import importlib, json, sys, traceback
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as e:  # a version conflict raises at import too
        out[name] = (traceback.format_exception_only(type(e), e)[-1].strip())[:400]
print(json.dumps(out))
"""


def package_env(src: Path, package: str, installed: bool) -> dict:
    """The environment the tests import the package under test with."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    if (src / "src" / package).is_dir() and not installed:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src / "src"), env.get("PYTHONPATH")) if p)
    return env


def check(python: str, suite: str, package: str, src: Path, installed: bool) -> list[str]:
    """Problems, each a line naming what is missing and the fix (pytest-timeout,
    optional, is checked by the runner itself)."""
    needed = COMMON + SUITE_MODULES.get(suite, [])
    names = [n for n, _ in needed] + [package]
    r = subprocess.run([python, "-c", _PROBE, *names], capture_output=True, text=True,
                       env=package_env(src, package, installed), timeout=300)
    if r.returncode != 0:
        return [f"{python} cannot run: {r.stderr.strip()[-400:]}"]
    failed = json.loads(r.stdout.strip().splitlines()[-1])
    problems = [f"{name}: {failed[name]} -> {fix}" for name, fix in needed if name in failed]
    if package in failed:
        where = "the installed package" if installed or not (src / "src" / package).is_dir() \
            else f"{src / 'src'} (first on PYTHONPATH)"
        problems.append(
            f"{package} from {where} does not import: {failed[package]} -> an older source tree "
            "needs its own dependency pins: make a venv for it (README.md, 'An older source "
            "tree') and pass --python <venv>/bin/python")
    return problems
