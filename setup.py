"""Builds the C++ core (CMake, against the installed torch) into torch_tpu/_C.

Two ways in:
- editable (`pip install --no-build-isolation -e .`, scripts/install.sh): the
  extension is built in ./build into python/torch_tpu, with the C++ unit
  tests, so that `ninja -C build` keeps working for development;
- a wheel (`pip install .`, `python -m build --wheel`): built in setuptools'
  temporary directory straight into the wheel, without the C++ tests, and
  relocatable (it finds libtorch in the installed torch package next to it).
The wheel requires exactly the torch version it was compiled against.
"""
import os
import shlex
import subprocess
import sys
from importlib.metadata import version

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(ROOT, "python", "torch_tpu")


def torch_requirement() -> str:
    """torch pinned to the public version of the torch we build against
    (2.13.0+cpu -> torch==2.13.0: the CPU and CUDA builds share the ABI)."""
    return "torch==" + version("torch").split("+")[0]


def forget_other_build_env(build_dir: str) -> None:
    """pip builds a checkout in place, each time in a new temporary build
    environment: a CMake cache left by an earlier one names its (deleted)
    cmake, ninja, python and torch, so it is dropped."""
    stamp = os.path.join(build_dir, "torch_tpu_build_python.txt")
    try:
        with open(stamp) as f:
            same = f.read() == sys.executable
    except OSError:
        same = not os.path.exists(os.path.join(build_dir, "CMakeCache.txt"))
    if not same:
        import shutil

        shutil.rmtree(build_dir, ignore_errors=True)
    os.makedirs(build_dir, exist_ok=True)
    with open(stamp, "w") as f:
        f.write(sys.executable)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        # Never autoload an installed (maybe stale) torch_tpu while building.
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        editable = self.inplace or getattr(self, "editable_mode", False)
        if editable:
            build_dir = os.environ.get("TORCH_TPU_BUILD_DIR", os.path.join(ROOT, "build"))
            options = [f"-DTORCH_TPU_OUTPUT_DIR={PACKAGE_DIR}"]
        else:
            build_dir = os.environ.get("TORCH_TPU_BUILD_DIR",
                                       os.path.join(os.path.abspath(self.build_temp), "cmake"))
            options = [f"-DTORCH_TPU_OUTPUT_DIR={os.path.dirname(target)}",
                       "-DTORCH_TPU_BUILD_TESTS=OFF", "-DTORCH_TPU_RELOCATABLE=ON"]
        if not editable:
            forget_other_build_env(build_dir)
        subprocess.check_call([
            "cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
            f"-DPython_EXECUTABLE={sys.executable}", *options,
            # CMAKE_ARGS: extra options, e.g. -DPJRT_INCLUDE_DIR=... on a
            # machine without the xla-cpu-pjrt wheel.
            *shlex.split(os.environ.get("CMAKE_ARGS", "")),
        ])
        subprocess.check_call(["cmake", "--build", build_dir])
        built = os.path.join(PACKAGE_DIR if editable else os.path.dirname(target),
                             os.path.basename(target))
        if os.path.abspath(built) != target:
            import shutil

            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(built, target)


setup(ext_modules=[Extension("torch_tpu._C", sources=[])], cmdclass={"build_ext": CMakeBuild},
      install_requires=[torch_requirement(), "xla-cpu-pjrt", "numpy"])
