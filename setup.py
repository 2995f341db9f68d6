"""Builds the C++ core (CMake, against the installed torch) into torch_tpu/_C."""
import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build_dir = os.environ.get("TORCH_TPU_BUILD_DIR", os.path.join(ROOT, "build"))
        cfg = [
            "cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DTORCH_TPU_OUTPUT_DIR={out_dir}",
        ]
        subprocess.check_call(cfg)
        subprocess.check_call(["cmake", "--build", build_dir])


setup(ext_modules=[Extension("torch_tpu._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
