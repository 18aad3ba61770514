"""The GPU kit's tree_vs_flat step (tests/gpu/tree_vs_flat.py) on the CPU, in bf16: the same
rollouts through a tiny random-weight decoder tree-packed and flat, against the float64 reference;
report.py passes it, and fails it when the tree mask is wrong (every branch sees its siblings).
The kit carries every script run.sh runs and the sibling modules those import."""

import ast
import json
import pathlib
import re
import subprocess
import sys
import types

import torch

GPU = pathlib.Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU))

import assemble_kit  # noqa: E402
import report  # noqa: E402
import tree_vs_flat  # noqa: E402

import packsched.kernels as kernels  # noqa: E402


def judge(data):
    step = {"name": "tree_vs_flat", "status": "ran", "rc": 0, "seconds": 1}
    inputs = types.SimpleNamespace(step=lambda name: step, data=lambda name: data, log=lambda n: "")
    return report.judge_tree_vs_flat(inputs)


def test_cpu_bf16_run_passes_the_2x_rule(tmp_path):
    out = tmp_path / "tree_vs_flat.json"
    subprocess.run(
        [sys.executable, str(GPU / "tree_vs_flat.py"), "--out", str(out), "--device", "cpu"],
        check=True,
        timeout=120,
    )
    data = json.loads(out.read_text())
    assert data["status"] == "ok", data.get("reason")
    assert data["rows"]["tree"] < data["rows"]["flat"]  # the shared prefixes forwarded once
    for what in ("logprobs", "grads"):
        # Both bf16 runs are off the float64 reference by bf16 noise, not by nothing ...
        assert 0 < data["error"][what]["flat"] < 0.1, what
    verdict = judge(data)
    assert verdict["status"] == "pass", verdict["reason"]
    assert verdict["reason"].startswith("logprobs: tree ")


def test_a_wrong_tree_mask_fails():
    data = tree_vs_flat.compare(torch, kernels, "cpu", 17, mask="broken")
    verdict = judge(data)
    assert verdict["status"] == "fail"
    assert "logprobs: tree error" in verdict["reason"] and "grads: tree error" in verdict["reason"]


def test_unavailable_and_failed_runs_are_reported_as_such():
    assert judge({"status": "unavailable", "reason": "no CUDA"})["status"] == "unavailable"
    assert judge({"status": "fail", "reason": "RuntimeError: x"})["status"] == "fail"


def test_the_kit_carries_every_script_run_sh_runs_and_their_imports():
    carried = {dst for _, dst in assemble_kit.SCRIPTS}
    run_sh = (GPU / "run.sh").read_text()
    scripts = set(re.findall(r"\$kit/(scripts/[\w.]+)", run_sh))
    assert "scripts/tree_vs_flat.py" in scripts
    assert scripts <= carried, scripts - carried
    siblings = {p.stem for p in GPU.glob("*.py")}
    for script in (s for s in scripts if s.endswith(".py")):
        tree = ast.parse((GPU / pathlib.Path(script).name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        for module in imported & siblings:
            assert f"scripts/{module}.py" in carried, (script, module)
