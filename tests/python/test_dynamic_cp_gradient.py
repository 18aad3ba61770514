"""End to end: dynamic context parallelism changes where the work runs, never the gradient.

R = 4 gloo processes (tests/python/helpers/dynamic_cp_rank.py) run one step planned by
packsched.dynamic_cp whose slots mix CP groups of sizes 1, 2 and 4 (and 3 where any size is
allowed); the gradients summed over the processes must equal the gradient of the same model on
the whole batch, padded, in one process (float64, 1e-10 relative), for every loss mode. Dropping
or repeating one group's micro-batch must break it.
"""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from sidecar import free_port

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "client" / "python" / "examples"))
sys.path.insert(0, str(HERE / "helpers"))

import dynamic_cp_rank  # noqa: E402
import tiny_lm  # noqa: E402

RANKS = 4


def run_step(tmp_path, sizes, control):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = tmp_path / f"{sizes}-{control}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "helpers" / "dynamic_cp_rank.py"),
                str(r),
                str(RANKS),
                sizes,
                str(port),
                str(out),
                control,
            ],
            env=env,
        )
        for r in range(RANKS)
    ]
    try:
        for proc in procs:
            assert proc.wait(timeout=300) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return torch.load(f"{out}.grads.pt")


def reference(mode):
    ids, masks = dynamic_cp_rank.batch()
    model = tiny_lm.TinyCausalLM(dtype=torch.float64)
    tiny_lm.padded_loss(model, ids, masks, mode, dynamic_cp_rank.SUM_NORM).backward()
    return tiny_lm.flat_grad(model)


def relative_error(got, expected):
    return float((got - expected).abs().max()) / max(1.0, float(expected.abs().max()))


@pytest.mark.parametrize("sizes,expected_sizes", [("powers_of_two", {1, 2, 4}), ("any", {3})])
def test_mixed_group_sizes_give_the_full_batch_gradient(tmp_path, sizes, expected_sizes):
    grads = run_step(tmp_path, sizes, "none")
    for mode in dynamic_cp_rank.MODES:
        used = set(grads[f"{mode}/sizes"].tolist())
        assert expected_sizes <= used, f"{mode}: the step used sizes {used}"
        error = relative_error(grads[mode], reference(mode))
        assert error <= 1e-10, f"{sizes} {mode}: max error {error:.3g}"


def test_a_dropped_or_repeated_shard_breaks_the_gradient(tmp_path):
    grads = run_step(tmp_path, "powers_of_two", "controls")
    expected = reference("token_mean")
    for control in ("drop", "duplicate"):
        assert relative_error(grads[control], expected) > 1e-6, control
