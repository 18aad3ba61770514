"""`pip install .`: builds the `packsched` package's native modules with CMake for the interpreter
that runs pip, and installs the package into that environment.

    pip install .                                # offline: pip install --no-build-isolation .
    pip install '.[client]'                      # with grpcio and protobuf (SchedulerClient)

The CMake build goes to build-pip/ in the checkout (PACKSCHED_BUILD_DIR elsewhere), so a second
install rebuilds only what changed; PACKSCHED_CMAKE_ARGS adds configure options, e.g.
"-DPACKSCHED_WITH_CUDA=OFF". The C++ dependencies come from deploy/install-deps.sh (Debian 12),
the programs (packsched-server, packsched) from the CMake build (docs/operating.md#building).
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
# The targets that make up build/python/packsched: the two extension modules and the gRPC stubs
# (the .py files are copied there at configure time).
TARGETS = ["packsched_py_kernels", "packsched_py_planner", "packsched_py_proto"]


class BuildWithCMake(build_ext):
    """Configures and builds the package's CMake targets for sys.executable, then copies the
    assembled package (build-dir/python/packsched) into the wheel's tree."""

    def run(self):
        build_dir = pathlib.Path(os.environ.get("PACKSCHED_BUILD_DIR", ROOT / "build-pip"))
        configure = [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build_dir),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            "-DPACKSCHED_WITH_PYTHON=ON",
            "-DPACKSCHED_WITH_TESTS=OFF",
            "-DPACKSCHED_WITH_BENCHMARKS=OFF",
            *shlex.split(os.environ.get("PACKSCHED_CMAKE_ARGS", "")),
        ]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        build = ["cmake", "--build", str(build_dir), "-j", jobs, "--target", *TARGETS]
        subprocess.run(build, check=True)
        package = build_dir / "python" / "packsched"
        if not (package / "planner.py").exists():
            sys.exit(f"packsched: the CMake build left no package in {package}")
        target = pathlib.Path(self.build_lib) / "packsched"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


class NativeDistribution(Distribution):
    """A wheel for this interpreter and platform: the package holds extension modules (and
    `build` runs build_ext, which builds and copies the whole package: there is no pure part)."""

    def has_ext_modules(self):
        return True


(ROOT / "build-pip").mkdir(exist_ok=True)
setup(
    packages=[],
    cmdclass={"build_ext": BuildWithCMake},
    distclass=NativeDistribution,
    options={
        "build": {"build_base": str(ROOT / "build-pip" / "setuptools")},
        "egg_info": {"egg_base": str(ROOT / "build-pip")},
    },
)
