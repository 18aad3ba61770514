"""The package installs like any PyPI package (scikit-build-core, pyproject.toml):

- `pip install '.[client]'` of the checkout, with build isolation, into a fresh venv (not
  --system-site-packages: numpy, grpcio and protobuf come from PyPI);
- `python -m build --sdist` of the checkout, then `python -m build --wheel` of that sdist, and the
  wheel installed into another fresh venv.

Each installed package is then used from a directory outside the checkout, with no PYTHONPATH: it
plans in process, runs a kernel and talks to a real sidecar. Both builds run with
PACKSCHED_WITH_CUDA=OFF (the CUDA kernels take many minutes on 2 cores). A third test configures
the wheel build with its defaults (CUDA on where nvcc is) and checks, without compiling, that each
.cu source is compiled once, for each release architecture once.

Sharing work: both builds put their CMake tree at build-pip/ inside the project they build (the
checkout, the unpacked sdist) and run with CCACHE_BASEDIR at that project, so ccache sees the
same relative paths and the second build reuses the first's objects. The extension modules'
sources are compiled by both: their pybind11 headers lie in each build's own isolated
environment, a new temporary directory every time."""

import collections
import json
import os
import pathlib
import re
import shutil
import subprocess
import tarfile
import tomllib
import zipfile

import pytest
from packsched import planner
from sidecar import Sidecar

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
SKBUILD = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["scikit-build"]
LENGTHS = [1200, 800, 3000, 450, 16000, 700, 2300, 5100]
# Generous bounds for a loaded 2-core machine; the builds take a few minutes.
BUILD_TIMEOUT = 1500

USE = """
import json, sys
import numpy as np
import packsched
from packsched import SchedulerClient

lengths = json.loads(sys.argv[2])
local = packsched.planner.plan_local(lengths, 16384)
packed = packsched.kernels.unpad(
    np.arange(6, dtype=np.float32).reshape(2, 3), np.array([[1, 1, 0], [1, 0, 0]], np.int32)
)
with SchedulerClient(sys.argv[1]) as client:
    remote = client.plan(1, lengths, 16384, stream="pip")
print(json.dumps({
    "file": packsched.__file__,
    "local": local.micro_batches,
    "packed": packed[0].tolist(),
    "remote": remote.micro_batches,
}))
"""


def build_env(**extra):
    """The caller's environment (HOME holds the pip and ccache settings and caches) without
    anything that would change what is built or imported: the build tree's PYTHONPATH, and
    CMake or packsched settings from the shell."""
    drop = {
        "PYTHONPATH",
        "PYTHONHOME",
        "CMAKE_ARGS",
        "CUDAARCHS",
        "CUDAFLAGS",
        "PACKSCHED_WITH_CUDA",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SKBUILD")}
    env.update(CMAKE_BUILD_PARALLEL_LEVEL="2", **extra)
    return env


def run(command, cwd, env, timeout=BUILD_TIMEOUT):
    done = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    return done


def fresh_venv(path):
    """A venv of Debian's Python that sees none of its packages; returns its python."""
    run(["/usr/bin/python3", "-m", "venv", path], cwd=path.parent, env=build_env(), timeout=180)
    return path / "bin" / "python"


def site_packages(python):
    return next((python.parent.parent / "lib").glob("python3*/site-packages"))


def cache_entry(build_dir, name):
    cache = (build_dir / "CMakeCache.txt").read_text()
    found = re.search(rf"^{name}:\w+=(.*)$", cache, re.M)
    return found.group(1) if found else None


def assert_package_only_cpu_build(build_dir):
    """A wheel's CMake build: for the interpreter scikit-build-core passed (not the default
    PACKSCHED_PYTHON), with PyPI's pybind11 from the isolated build environment, no CUDA source
    and no program built. Returns the interpreter."""
    python = cache_entry(build_dir, "_Python_EXECUTABLE")  # the one FindPython took
    assert python != "/usr/bin/python3"
    assert not cache_entry(build_dir, "pybind11_DIR").startswith("/usr/")
    assert cache_entry(build_dir, "PACKSCHED_WITH_CUDA") == "OFF"
    commands = json.loads((build_dir / "compile_commands.json").read_text())
    assert not [c["file"] for c in commands if c["file"].endswith(".cu")]
    programs = [p.name for p in (build_dir / "bin").glob("*")]
    assert not programs, f"a wheel build built programs: {programs}"
    return pathlib.Path(python)


def assert_installed_package_works(python, workdir):
    """From `workdir` (outside the checkout), with no PYTHONPATH: plan, a kernel, a real sidecar."""
    site = site_packages(python)
    assert next((site / "packsched").glob("_planner.cpython-*.so"))
    assert next((site / "packsched").glob("_kernels.cpython-*.so"))
    assert (site / "packsched" / "v1" / "scheduler_pb2_grpc.py").exists()
    script = workdir / "use.py"
    script.write_text(USE)
    with Sidecar(workdir) as sidecar:
        out = subprocess.run(
            [str(python), str(script), sidecar.target, json.dumps(LENGTHS)],
            cwd=workdir,
            env={"PATH": "/usr/bin:/bin", "HOME": str(workdir)},
            text=True,
            capture_output=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert pathlib.Path(got["file"]).resolve().is_relative_to(site.resolve())
    assert got["local"] == planner.plan_local(LENGTHS, 16384).micro_batches  # the build tree's
    assert got["remote"] == got["local"]  # a group of one agrees its own count
    assert got["packed"] == [0.0, 1.0, 3.0]  # the mask's tokens, row by row


@pytest.fixture(scope="module")
def build_tool(tmp_path_factory):
    """A venv with PyPI's `build` at the version requirements/test.lock pins."""
    lock = (CHECKOUT / "requirements" / "test.lock").read_text()
    pin = re.search(r"^build==\S+$", lock, re.M).group(0)
    python = fresh_venv(tmp_path_factory.mktemp("tool") / "venv")
    run([python, "-m", "pip", "install", "-q", pin], cwd=python.parent, env=build_env())
    return python


def test_pip_install_of_the_checkout_into_a_fresh_venv(tmp_path):
    python = fresh_venv(tmp_path / "venv")
    build_dir = CHECKOUT / "build-pip"
    shutil.rmtree(build_dir, ignore_errors=True)
    env = build_env(PACKSCHED_WITH_CUDA="OFF", CCACHE_BASEDIR=str(CHECKOUT))
    pip = [python, "-m", "pip", "install", "--config-settings=build-dir=build-pip", ".[client]"]
    run(pip, cwd=CHECKOUT, env=env)
    assert assert_package_only_cpu_build(build_dir).parent == python.parent  # the venv's own
    assert_installed_package_works(python, tmp_path)
    shutil.rmtree(build_dir)


def test_sdist_builds_a_wheel_that_installs_into_a_fresh_venv(build_tool, tmp_path):
    dist = tmp_path / "dist"
    run([build_tool, "-m", "build", "--sdist", "--outdir", dist, CHECKOUT], CHECKOUT, build_env())
    (sdist,) = dist.glob("packsched-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(tmp_path / "unpacked", **safe)
    for needed in [
        "pyproject.toml",
        "CMakeLists.txt",
        "cmake/PackschedToolchains.cmake",
        "proto/packsched/v1/scheduler.proto",
        "server/planner/planner.cc",
        "server/base/logging.cc",
        "kernels/cuda/attention_fwd.cu",
        "client/python/src/planner_module.cc",
        "client/python/packsched/__init__.py",
        "deploy/install-deps.sh",
        "README.md",
        "LICENSE",
    ]:
        assert needed in names, needed
    tops = {n.split("/")[0] for n in names}
    assert not tops & {"tests", ".venv", ".git", ".ci", "requirements"}, tops
    assert not [t for t in tops if t.startswith("build")], tops

    # The wheel from the sdist alone (not the checkout), in its own isolated environment.
    (source,) = (tmp_path / "unpacked").iterdir()
    env = build_env(PACKSCHED_WITH_CUDA="OFF", CCACHE_BASEDIR=str(source))
    wheel_build = [build_tool, "-m", "build", "--wheel", "--outdir", dist, "-Cbuild-dir=build-pip"]
    run(wheel_build + [source], cwd=source, env=env)
    (wheel,) = dist.glob("packsched-*.whl")
    assert re.fullmatch(r"packsched-0\.1\.0-cp3\d+-cp3\d+-linux_x86_64\.whl", wheel.name)
    with zipfile.ZipFile(wheel) as archive:
        files = archive.namelist()
    assert {f.split("/")[0] for f in files} == {"packsched", "packsched-0.1.0.dist-info"}
    assert len([f for f in files if f.endswith(".so")]) == 2  # _planner and _kernels
    assert_package_only_cpu_build(source / "build-pip")

    python = fresh_venv(tmp_path / "venv")
    run([python, "-m", "pip", "install", f"{wheel}[client]"], cwd=tmp_path, env=build_env())
    assert_installed_package_works(python, tmp_path)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (configure only)")
def test_wheel_build_compiles_each_cuda_source_once_per_release_architecture(build_tool, tmp_path):
    """Configures the wheel build as `pip install .` does (its defaults: CUDA on, the release
    architectures from pyproject.toml), builds nothing (ninja -n), and reads the commands the
    wheel's build targets would run."""
    build_dir = tmp_path / "build"
    wheel_build = [build_tool, "-m", "build", "--wheel", "--outdir", tmp_path / "dist"]
    dry = [f"-Cbuild-dir={build_dir}", "-Cbuild.tool-args=-n"]
    run(wheel_build + dry + [CHECKOUT], cwd=CHECKOUT, env=build_env())
    assert cache_entry(build_dir, "PACKSCHED_WITH_CUDA") == "ON"
    commands = run(
        ["ninja", "-C", build_dir, "-t", "commands", *SKBUILD["build"]["targets"]],
        cwd=build_dir,
        env=build_env(),
        timeout=60,
    ).stdout.splitlines()
    nvcc = [c for c in commands if "nvcc" in c and " -c " in c]
    compiled = collections.Counter(re.search(r" -c (\S+)", c).group(1) for c in nvcc)
    sources = sorted(str(p) for p in (CHECKOUT / "kernels" / "cuda").glob("*.cu"))
    assert sorted(compiled) == sources  # every kernel of kernels/cuda is in the wheel
    assert set(compiled.values()) == {1}, compiled
    for command in nvcc:
        archs = re.findall(r"(?:--generate-code=|-gencode[= ])arch=compute_(\d+)", command)
        archs += re.findall(r"(?:-arch|--gpu-architecture)[= ](?:sm|compute)_(\d+)", command)
        assert sorted(archs) == ["80", "90"], command  # the release architectures, once each
    # No second target compiles a kernel source: every configured target (the wheel's or not).
    database = json.loads((build_dir / "compile_commands.json").read_text())
    cu = collections.Counter(e["file"] for e in database if e["file"].endswith(".cu"))
    assert sorted(cu) == sources and set(cu.values()) == {1}, cu
