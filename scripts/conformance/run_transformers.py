#!/usr/bin/env python
"""Run the upstream Transformers test suites, unmodified, on "tpu" and on CPU.

The test sources are NOT part of this repository: pass the path of a source
checkout of the pinned Transformers release with ``--src`` (see README.md,
"Transformers conformance"). Each test module runs in its own pytest process,
once with ``TRANSFORMERS_TEST_DEVICE=tpu`` (+ ``TRANSFORMERS_TEST_BACKEND=torch_tpu``
and ``TRANSFORMERS_TEST_DEVICE_SPEC`` = ``device_spec_tpu.py``) and once on CPU
(``TRANSFORMERS_TEST_DEVICE=cpu``, torch_tpu's autoload turned off), offline
(``HF_HUB_OFFLINE=1``). The report (markdown + json) gives per module
passed/failed/skipped/errors for both devices and the pass rate on tpu among
the tests that pass on CPU; tpu failures of CPU-passing tests are matched
against ``known_failures.txt``.

    python scripts/conformance/run_transformers.py --src /tmp/transformers-src \\
        --report /tmp/conformance/report --workers 2
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as _dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import prerequisites  # noqa: E402
SPEC_FILE = HERE / "device_spec_tpu.py"
PLUGIN = "_conformance_plugin"

# The listed models of the conformance issue, then the generation tests.
DEFAULT_MODELS = [
    "llama", "qwen3", "qwen3_moe", "gemma3", "mistral", "gpt2",
    "bert", "t5", "vit", "whisper", "clip",
]
DEFAULT_MODULES = DEFAULT_MODELS + ["generation"]
DEVICES = ("tpu", "cpu")

# Test suites this runner knows. A suite names the Hugging Face package under
# test: its upper-cased name is the prefix of the testing_utils environment
# variables (<PREFIX>_TEST_DEVICE, _TEST_BACKEND, _TEST_DEVICE_SPEC: the same
# scheme in transformers and diffusers), and the checkout's src/<package> is
# put first on PYTHONPATH. run_diffusers.py adds the "diffusers" suite.
SUITES = {
    "transformers": {
        "package": "transformers",
        "title": "Transformers",
        "default_modules": DEFAULT_MODULES,
        "known_failures": HERE / "known_failures.txt",
    },
}
OUTCOMES = ("passed", "failed", "skipped", "errors")


def resolve_modules(src: Path, names: list[str]) -> list[tuple[str, list[str]]]:
    """Map each selection to (label, [paths relative to src]).

    A bare model name ``m`` means ``tests/models/m/test_modeling_m.py``;
    ``generation`` means every ``tests/generation/test_*.py`` file (each its
    own process); anything else is a path (file or directory) inside src.
    """
    out = []
    for name in names:
        if name == "generation":
            gen = sorted((src / "tests" / "generation").glob("test_*.py"))
            if not gen:
                raise SystemExit(f"no tests/generation/test_*.py under {src}")
            out += [(f"generation/{p.stem}", [str(p.relative_to(src))]) for p in gen]
            continue
        cand = src / "tests" / "models" / name / f"test_modeling_{name}.py"
        if "/" not in name and cand.is_file():
            out.append((name, [str(cand.relative_to(src))]))
            continue
        path = (src / name) if not os.path.isabs(name) else Path(name)
        if path.exists():
            out.append((name, [str(path.resolve().relative_to(src.resolve()))]))
            continue
        raise SystemExit(f"unknown module {name!r}: neither {cand} nor {path} exists")
    return out


def has_module(python: str, mod: str) -> bool:
    r = subprocess.run([python, "-c", f"import {mod}"], capture_output=True,
                       env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    return r.returncode == 0


def load_known_failures(path: Path) -> dict[str, str]:
    """``<pytest node id>  # <one-line cause>`` per line; ``#`` lines are comments."""
    known = {}
    if not path.is_file():
        return known
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        nodeid, _, cause = line.partition(" # ")
        known[nodeid.strip()] = cause.strip()
    return known


def run_one(label: str, paths: list[str], device: str, args, workdir: Path) -> dict:
    """Run one module on one device in its own process; return its results."""
    safe = label.replace("/", "__")
    results = workdir / f"{safe}.{device}.jsonl"
    log = workdir / f"{safe}.{device}.log"
    results.unlink(missing_ok=True)
    src = Path(args.src).resolve()
    env = dict(os.environ)
    env.update({
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "CONFORMANCE_RESULTS": str(results),
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    # Our plugin, and the checkout's own transformers when it ships src/
    # (upstream's conftest.py puts src/ on sys.path too, but too late for
    # anything imported while plugins load).
    pp = [str(HERE)]
    if (src / "src" / args.package).is_dir() and not args.installed_package:
        pp.append(str(src / "src"))
    env["PYTHONPATH"] = os.pathsep.join(pp + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    pre = args.package.upper()
    for k in ("TEST_DEVICE", "TEST_BACKEND", "TEST_DEVICE_SPEC"):
        env.pop(f"{pre}_{k}", None)
    if device == "tpu":
        env[f"{pre}_TEST_DEVICE"] = "tpu"
        env[f"{pre}_TEST_BACKEND"] = "torch_tpu"
        # 2 XLA:CPU devices per process (tpu:0, tpu:1): the distributed tests
        # (FSDP2, tensor parallel) start one process per device, like CPU's
        # os.cpu_count() gloo workers. An explicit setting wins.
        env.setdefault("TORCH_TPU_CPU_DEVICES", "2")
        # testing_utils imports the spec by its bare module name relative to
        # the working directory (the checkout: upstream tests that re-run
        # themselves in a subprocess use paths relative to it), so main()
        # copies it into the checkout's root.
        env[f"{pre}_TEST_DEVICE_SPEC"] = SPEC_FILE.name
    else:
        env[f"{pre}_TEST_DEVICE"] = "cpu"
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    if args.run_slow:
        env["RUN_SLOW"] = "1"
    else:
        env.pop("RUN_SLOW", None)

    cmd = [args.python, "-m", "pytest", "-p", "no:cacheprovider", "-p", PLUGIN,
           "-q", "-rN", "--no-header", "-o", "log_cli=false",
           f"--rootdir={src}", "-c", str(src / "pyproject.toml")]
    if args.pytest_timeout:
        cmd += [f"--timeout={args.test_timeout}"]
    if args.k:
        cmd += ["-k", args.k]
    cmd += list(args.pytest_arg or [])
    cmd += [str(src / p) for p in paths]

    t0 = time.time()
    timed_out = False
    with open(log, "w", encoding="utf-8") as lf:
        lf.write("$ " + " ".join(cmd) + "\n")
        lf.flush()
        proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=lf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=args.module_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    elapsed = time.time() - t0

    tests: dict[str, dict] = {}
    collection_errors = []
    if results.is_file():
        for line in results.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec["outcome"] == "collection_error":
                collection_errors.append(rec)
            elif rec["outcome"] == "started":
                tests.setdefault(rec["nodeid"], {"outcome": "errors",
                                                 "message": "did not finish (module timeout or crash)"})
            else:
                out = "errors" if rec["outcome"] == "error" else rec["outcome"]
                tests[rec["nodeid"]] = {"outcome": out, "message": rec.get("message", ""),
                                        "duration": rec.get("duration", 0.0)}
    counts = {o: 0 for o in OUTCOMES}
    for t in tests.values():
        counts[t["outcome"]] += 1
    counts["errors"] += len(collection_errors)
    note = ""
    if timed_out:
        note = f"module timeout after {args.module_timeout}s"
    elif rc not in (0, 1, 5) and not tests:
        note = f"pytest exit code {rc}; see {log.name}"
    elif collection_errors:
        note = "collection error: " + (collection_errors[0]["message"] or "see log")
    print(f"[{label} {device}] {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped, {counts['errors']} errors in {elapsed:.0f}s"
          + (f" ({note})" if note else ""), flush=True)
    return {"module": label, "device": device, "paths": paths, "counts": counts, "rc": rc,
            "seconds": round(elapsed, 1), "note": note, "log": str(log), "tests": tests,
            "collection_errors": collection_errors}


def summarize(runs: list[dict], known: dict[str, str]) -> dict:
    by_mod: dict[str, dict] = {}
    for r in runs:
        by_mod.setdefault(r["module"], {})[r["device"]] = r
    modules = []
    tot = {"cpu_pass": 0, "tpu_pass_of_cpu_pass": 0}
    regressions = []
    for label, devs in by_mod.items():
        row = {"module": label}
        for d in DEVICES:
            if d in devs:
                row[d] = dict(devs[d]["counts"], seconds=devs[d]["seconds"], note=devs[d]["note"])
        if "tpu" in devs and "cpu" in devs:
            cpu_pass = {n for n, t in devs["cpu"]["tests"].items() if t["outcome"] == "passed"}
            tpu_tests = devs["tpu"]["tests"]
            both = {n for n in cpu_pass if tpu_tests.get(n, {}).get("outcome") == "passed"}
            row["cpu_pass"] = len(cpu_pass)
            row["tpu_pass_of_cpu_pass"] = len(both)
            row["pass_rate"] = round(100.0 * len(both) / len(cpu_pass), 2) if cpu_pass else None
            tot["cpu_pass"] += len(cpu_pass)
            tot["tpu_pass_of_cpu_pass"] += len(both)
            for n in sorted(cpu_pass - both):
                t = tpu_tests.get(n, {"outcome": "missing", "message": "not run on tpu"})
                regressions.append({"nodeid": n, "module": label, "tpu_outcome": t["outcome"],
                                    "message": t.get("message", ""), "known": n in known,
                                    "cause": known.get(n, "")})
        modules.append(row)
    tot["pass_rate"] = (round(100.0 * tot["tpu_pass_of_cpu_pass"] / tot["cpu_pass"], 2)
                        if tot["cpu_pass"] else None)
    return {"modules": modules, "total": tot, "tpu_failures_of_cpu_passing": regressions}


def write_report(path: Path, meta: dict, summary: dict, runs: list[dict],
                 title: str = "Transformers") -> tuple[Path, Path]:
    base = path.with_suffix("") if path.suffix in (".md", ".json") else path
    base.parent.mkdir(parents=True, exist_ok=True)
    md, js = base.with_suffix(".md"), base.with_suffix(".json")
    js.write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1), encoding="utf-8")

    def c(row, d, k):
        return str(row[d][k]) if d in row else "-"

    lines = [f"# {title} conformance: tpu vs CPU", ""]
    for k, v in meta.items():
        lines.append(f"- {k}: `{v}`")
    lines += ["", "| module | tpu passed | tpu failed | tpu skipped | tpu errors | cpu passed | cpu failed "
              "| cpu skipped | cpu errors | tpu pass among cpu-passing | note |",
              "| --- | " + "--- | " * 10]
    for row in summary["modules"]:
        rate = (f"{row['tpu_pass_of_cpu_pass']}/{row['cpu_pass']} ({row['pass_rate']}%)"
                if row.get("pass_rate") is not None else "-")
        note = "; ".join(f"{d}: {row[d]['note']}" for d in DEVICES if d in row and row[d]["note"])
        lines.append(f"| {row['module']} | " + " | ".join(c(row, d, k) for d in DEVICES for k in OUTCOMES)
                     + f" | {rate} | {note} |")
    t = summary["total"]
    if t["pass_rate"] is not None:
        lines += ["", f"**Total: {t['tpu_pass_of_cpu_pass']} of {t['cpu_pass']} CPU-passing tests pass on tpu "
                  f"({t['pass_rate']}%).**"]
    regs = summary["tpu_failures_of_cpu_passing"]
    if regs:
        lines += ["", "## Tests that pass on CPU and not on tpu", "",
                  "| test | tpu outcome | known cause / message |", "| --- | --- | --- |"]
        for r in regs:
            why = ("known: " + r["cause"]) if r["known"] else ("NEW: " + r["message"].replace("|", "\\|"))
            lines.append(f"| `{r['nodeid']}` | {r['tpu_outcome']} | {why[:300]} |")
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return md, js


def main(argv=None, suite: str = "transformers", description: str | None = None) -> int:
    cfg = SUITES[suite]
    pkg, title, default_modules = cfg["package"], cfg["title"], cfg["default_modules"]
    ap = argparse.ArgumentParser(description=description or __doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help=f"source checkout of the pinned {title} release")
    ap.add_argument("--report", required=True, help="report path; writes <report>.md and <report>.json")
    ap.add_argument("--modules", nargs="+", default=default_modules,
                    help="model names (tests/models/<m>/test_modeling_<m>.py), 'generation', "
                         f"or paths inside --src (default: {' '.join(default_modules)})")
    ap.add_argument("-k", default=None, help="pytest -k expression passed to every module")
    ap.add_argument("--workers", type=int, default=1, help="module runs in parallel")
    ap.add_argument("--devices", default="tpu,cpu", help="comma list among tpu,cpu")
    ap.add_argument("--test-timeout", type=int, default=300, help="per-test timeout (pytest-timeout), s")
    ap.add_argument("--module-timeout", type=int, default=3600, help="per module-and-device process timeout, s")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs pytest")
    ap.add_argument("--known-failures", default=str(cfg["known_failures"]))
    ap.add_argument(f"--installed-{pkg}", dest="installed_package", action="store_true",
                    help=f"test the installed {pkg} even when the checkout has src/")
    ap.add_argument("--run-slow", action="store_true", help="set RUN_SLOW=1 (default: slow tests skipped)")
    ap.add_argument("--pytest-arg", action="append", help="extra pytest argument (repeatable)")
    ap.add_argument("--keep-workdir", action="store_true", help="keep per-run logs (printed path)")
    ap.add_argument("--skip-prerequisites", action="store_true",
                    help="run even if the prerequisite check finds something missing")
    args = ap.parse_args(argv)

    src = Path(args.src).resolve()
    if not (src / "tests").is_dir() or not (src / "pyproject.toml").is_file():
        ap.error(f"--src {src} is not a {title} source checkout (needs tests/ and pyproject.toml)")
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if not devices or any(d not in DEVICES for d in devices):
        ap.error("--devices takes tpu and/or cpu")
    if args.workers < 1:
        ap.error("--workers must be >= 1")
    args.package = pkg
    mods = resolve_modules(src, args.modules)
    problems = prerequisites.check(args.python, suite, pkg, src, args.installed_package)
    if problems and not args.skip_prerequisites:
        print(f"The {title} suite cannot run yet with {args.python}; missing:", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        print("(README.md in scripts/conformance lists every step; --skip-prerequisites "
              "runs anyway)", file=sys.stderr)
        return 2
    args.pytest_timeout = has_module(args.python, "pytest_timeout")
    if not args.pytest_timeout:
        print("warning: pytest-timeout is not installed; only the per-module timeout applies", file=sys.stderr)

    report_path = Path(args.report)
    workdir = Path(tempfile.mkdtemp(prefix="tfm-conformance-"))
    # The only file the runner writes into the checkout (see run_one).
    shutil.copy(SPEC_FILE, src / SPEC_FILE.name)
    jobs = [(label, paths, d) for label, paths in mods for d in devices]
    t0 = time.time()
    runs = []
    with cf.ThreadPoolExecutor(max_workers=args.workers) as ex:
        futs = [ex.submit(run_one, label, paths, d, args, workdir) for label, paths, d in jobs]
        for f in futs:
            runs.append(f.result())

    # Logs next to the report, so a failure can be read after the run.
    logdir = (report_path.with_suffix("") if report_path.suffix in (".md", ".json") else report_path)
    logdir = logdir.parent / (logdir.name + "_logs")
    logdir.mkdir(parents=True, exist_ok=True)
    for r in runs:
        lp = Path(r["log"])
        if lp.is_file():
            shutil.copy(lp, logdir / lp.name)
            r["log"] = str(logdir / lp.name)

    tf_version = subprocess.run(
        [args.python, "-c", f"import {pkg}; print({pkg}.__version__, {pkg}.__file__)"],
        capture_output=True, text=True, cwd=workdir,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
             "PYTHONPATH": str(src / "src") if (src / "src").is_dir() and not args.installed_package
             else os.environ.get("PYTHONPATH", "")}).stdout.strip()
    meta = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "src": str(src),
        pkg: tf_version,
        "python": args.python,
        "modules": " ".join(args.modules),
        "k": args.k or "",
        "per-test timeout (s)": args.test_timeout if args.pytest_timeout else "none (no pytest-timeout)",
        "per-module timeout (s)": args.module_timeout,
        "RUN_SLOW": "1" if args.run_slow else "unset",
        "wall time (s)": round(time.time() - t0, 1),
    }
    summary = summarize(runs, load_known_failures(Path(args.known_failures)))
    md, js = write_report(report_path, meta, summary, runs, title=title)
    if not args.keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    t = summary["total"]
    print(f"report: {md} and {js}")
    if t["pass_rate"] is not None:
        print(f"tpu passes {t['tpu_pass_of_cpu_pass']} of {t['cpu_pass']} CPU-passing tests ({t['pass_rate']}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
