"""Builds the C++ core (CMake, against the installed torch) into torch_tpu/_C.

The extension is always built into python/torch_tpu (so that `ninja -C build`
keeps working for development) and copied to where setuptools wants it.
"""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(ROOT, "python", "torch_tpu")


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        # Never autoload an installed (maybe stale) torch_tpu while building.
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        build_dir = os.environ.get("TORCH_TPU_BUILD_DIR", os.path.join(ROOT, "build"))
        subprocess.check_call([
            "cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DTORCH_TPU_OUTPUT_DIR={PACKAGE_DIR}",
            # CMAKE_ARGS: extra options, e.g. -DPJRT_INCLUDE_DIR=... on a
            # machine without the xla-cpu-pjrt wheel.
            *shlex.split(os.environ.get("CMAKE_ARGS", "")),
        ])
        subprocess.check_call(["cmake", "--build", build_dir])
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        built = os.path.join(PACKAGE_DIR, os.path.basename(target))
        if os.path.abspath(built) != target:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(built, target)


setup(ext_modules=[Extension("torch_tpu._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
