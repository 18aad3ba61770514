"""`pip install .` into a fresh venv builds the package for the venv's interpreter and installs
it into the venv's site-packages: from a shell outside the checkout, with no PYTHONPATH, the
installed package plans in process, runs a kernel and talks to a real sidecar.

The venv sees Debian's numpy, torch, grpcio and protobuf (--system-site-packages) and pip runs
offline (--no-build-isolation --no-index). The CMake build goes to the checkout's build-pip/
(setup.py), at the same depth as build/, so ccache serves what the build tree compiled already,
and the CUDA setting follows the build tree's."""

import json
import os
import pathlib
import re
import subprocess

import packsched
from packsched import planner
from sidecar import Sidecar

BUILD = pathlib.Path(packsched.__file__).resolve().parents[2]
CHECKOUT = pathlib.Path(__file__).resolve().parents[2]

USE = """
import json, sys
import numpy as np
import packsched
from packsched import SchedulerClient

lengths = [1200, 800, 3000, 450, 16000, 700, 2300, 5100]
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


def build_tree_cmake_args():
    cache = (BUILD / "CMakeCache.txt").read_text()
    cuda = re.search(r"^PACKSCHED_WITH_CUDA:BOOL=(\w+)$", cache, re.M)
    return f"-DPACKSCHED_WITH_CUDA={cuda.group(1) if cuda else 'OFF'}"


def test_pip_install_into_a_venv_and_use_it_from_outside_the_checkout(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
        check=True,
        timeout=120,
    )
    # The caller's environment (HOME holds ccache's settings) without the build tree's package.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PACKSCHED_CMAKE_ARGS=build_tree_cmake_args(), CMAKE_BUILD_PARALLEL_LEVEL="2")
    pip = [str(venv / "bin" / "pip"), "install", "--no-build-isolation", "--no-index"]
    install = subprocess.run(
        pip + ["--no-cache-dir", ".[client]"],
        cwd=CHECKOUT,
        env=env,
        text=True,
        capture_output=True,
        timeout=1500,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert next((site / "packsched").glob("_planner.cpython-*.so"))
    assert (site / "packsched" / "v1" / "scheduler_pb2.py").exists()

    script = tmp_path / "use.py"
    script.write_text(USE)
    with Sidecar(tmp_path) as sidecar:
        out = subprocess.run(
            ["bash", "-c", f'"{venv}/bin/python" use.py {sidecar.target}'],
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            text=True,
            capture_output=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert pathlib.Path(got["file"]).resolve().is_relative_to(site.resolve())
    lengths = [1200, 800, 3000, 450, 16000, 700, 2300, 5100]
    assert got["local"] == planner.plan_local(lengths, 16384).micro_batches
    assert got["remote"] == got["local"]  # a group of one agrees its own count
    assert got["packed"] == [0.0, 1.0, 3.0]  # the mask's tokens, row by row
