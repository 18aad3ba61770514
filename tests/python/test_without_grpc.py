"""The planner, the kernels and the drop-ins import and run without grpcio and protobuf; the
sidecar client, asked for there, says what to install."""

import pathlib
import subprocess
import sys

import packsched

PACKAGE_DIR = pathlib.Path(packsched.__file__).resolve().parents[1]

# Run first in a fresh interpreter: any import of grpc or google.protobuf fails, as where they are
# not installed.
BLOCK = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" or name.startswith("grpc.") or name.startswith("google.protobuf"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Block())
"""


def run_blocked(code):
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code],
        cwd=PACKAGE_DIR.parent,
        env={"PYTHONPATH": str(PACKAGE_DIR), "PATH": "/usr/bin:/bin"},
        text=True,
        capture_output=True,
        timeout=120,
    )


def test_the_block_really_blocks_grpc():
    out = run_blocked("import grpc")
    assert out.returncode != 0
    assert "No module named 'grpc'" in out.stderr


def test_planner_kernels_and_compat_work_without_grpc():
    out = run_blocked(
        "import numpy as np, sys\n"
        "import packsched, packsched.planner, packsched.kernels, packsched.compat\n"
        "import packsched.compat.verl, packsched.compat.openrlhf, packsched.compat.slime\n"
        "plan = packsched.planner.plan_local([5, 3, 9, 1], 10)\n"
        "packed = packsched.kernels.unpad(np.ones((2, 3), np.float32),"
        " np.array([[1, 1, 0], [1, 0, 0]], np.int32))\n"
        "print(plan.micro_batches, packed[0].shape[0])\n"
        "print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith('google.protobuf')))\n"
    )
    assert out.returncode == 0, out.stderr
    parts, modules = out.stdout.strip().splitlines()
    assert parts == f"{packsched.planner.plan_local([5, 3, 9, 1], 10).micro_batches} 3"
    assert modules == "[]"


def test_scheduler_client_names_what_to_install():
    for code in ("from packsched import SchedulerClient", "import packsched.client"):
        out = run_blocked(code)
        assert out.returncode != 0
        assert "ImportError" in out.stderr
        assert "needs grpcio and protobuf" in out.stderr
        assert "pip install 'packsched[client]'" in out.stderr
        assert "'grpc' is missing" in out.stderr


def test_the_client_is_still_reachable_from_the_package():
    from packsched import SchedulerClient, SchedulerError

    assert packsched.SchedulerClient is SchedulerClient
    assert packsched.client.SchedulerError is SchedulerError
