"""`cmake --install` puts the programs and a working Python package under the prefix."""

import pathlib
import re
import subprocess
import sys

import packsched

BUILD = pathlib.Path(packsched.__file__).resolve().parents[2]


def test_install_gives_programs_and_an_importable_package(tmp_path):
    subprocess.run(
        ["cmake", "--install", str(BUILD), "--prefix", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "bin" / "packsched-server").exists()
    assert (tmp_path / "bin" / "packsched").exists()
    # Debian's interpreter reads dist-packages; any other (the venv's) site-packages.
    python = re.search(r"^PACKSCHED_PYTHON:\w+=(.*)$", (BUILD / "CMakeCache.txt").read_text(), re.M)
    site_dir = "dist-packages" if python.group(1) == "/usr/bin/python3" else "site-packages"
    (site,) = tmp_path.glob(f"lib/python3*/{site_dir}")
    code = (
        "import packsched, packsched.client, packsched.compat.verl; "
        "print(packsched.planner.plan_local([5, 3, 9, 1], 10).micro_batches)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        check=True,
        text=True,
        capture_output=True,
        env={"PYTHONPATH": str(site)},
    )
    expected = packsched.planner.plan_local([5, 3, 9, 1], 10).micro_batches  # the build tree's
    assert out.stdout.strip() == str(expected)
    assert (
        str(site)
        in subprocess.run(
            [sys.executable, "-c", "import packsched; print(packsched.__file__)"],
            cwd=tmp_path,
            check=True,
            text=True,
            capture_output=True,
            env={"PYTHONPATH": str(site)},
        ).stdout
    )
