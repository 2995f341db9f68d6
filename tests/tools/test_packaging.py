"""`pip install .` builds in an isolated environment: every build requirement
must be pinned, torch to the version the project supports (a bare or ranged
torch would pull a multi-GB CUDA build)."""
import importlib.util
import os
import re
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_build_requirements_are_pinned():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        build = tomllib.load(f)["build-system"]
    names = {}
    for req in build["requires"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.+]*)", req)
        assert m, f"build requirement not pinned exactly: {req!r}"
        names[m.group(1).lower()] = m.group(2)
    assert names["torch"] == "2.13.0"
    assert {"setuptools", "cmake", "ninja", "xla-cpu-pjrt"} <= names.keys()
    assert build["build-backend"] == "setuptools.build_meta"


def test_wheel_requires_the_torch_it_was_built_against():
    spec = importlib.util.spec_from_file_location("torch_tpu_setup", os.path.join(ROOT, "setup.py"))
    src = open(spec.origin).read()
    # Only the helper: running setup.py would start a build.
    namespace = {"__file__": spec.origin}
    exec(compile(src.split("class CMakeBuild")[0], spec.origin, "exec"), namespace)
    import torch

    assert namespace["torch_requirement"]() == "torch==" + torch.__version__.split("+")[0]
