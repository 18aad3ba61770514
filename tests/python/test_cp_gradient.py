"""End to end: context parallelism changes where the work runs, never the gradient.

CP = 2 and 4 simulated as gloo processes inside DP = 2 (tests/python/helpers/cp_gradient_rank.py):
every process holds its head-tail shard of each packed micro-batch, all-gathers the keys and
values of its CP group, and backwards its rows' weighted loss; the gradients summed over all
processes must equal the gradient of the same model on the whole batch, padded, in one process
(float64, 1e-10 relative), for token_mean and sample_mean.
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

import cp_gradient_rank  # noqa: E402
import tiny_lm  # noqa: E402

DP = 2


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_gradient_equals_the_padded_full_batch(tmp_path, cp):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "helpers" / "cp_gradient_rank.py"),
                str(r),
                str(cp),
                str(DP),
                str(port),
                str(tmp_path / "out"),
            ],
            env=env,
        )
        for r in range(cp * DP)
    ]
    try:
        for proc in procs:
            assert proc.wait(timeout=300) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    grads = torch.load(tmp_path / "out.grads.pt")
    ids, masks = tiny_lm.make_batch(8 * DP + 1, seed=cp)
    for mode in cp_gradient_rank.MODES:
        assert int(grads[f"{mode}/num_micro_batches"]) >= 2  # micro-batching is exercised
        model = tiny_lm.TinyCausalLM(dtype=torch.float64)
        tiny_lm.padded_loss(model, ids, masks, mode).backward()
        expected = tiny_lm.flat_grad(model)
        error = float((grads[mode] - expected).abs().max())
        scale = max(1.0, float(expected.abs().max()))
        assert error <= 1e-10 * scale, f"cp={cp} {mode}: max error {error:.3g}"
