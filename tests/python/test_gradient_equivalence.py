"""End to end: packing, micro-batching and data parallelism change the speed, never the gradient.

W data-parallel ranks, each with its own real sidecar (the sidecars form one rank group over Gloo
on loopback), plan their share of a batch, run every micro-batch packed with packsched's kernels
(positions, shifted labels, varlen attention, packed cross entropy) weighted by the plan's loss
weights, and all-reduce their gradients. The result must equal the gradient of the same model on
the whole batch, padded, in one process — for every loss mode and both DP reductions — and must
not when labels are shifted across sequence boundaries (the test catches that bug).
"""

import contextlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from sidecar import free_port, start_group

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "client" / "python" / "examples"))
sys.path.insert(0, str(HERE / "helpers"))

import gradient_rank  # noqa: E402
import tiny_lm  # noqa: E402

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}  # relative to the largest gradient entry


def reference_gradient(world_size, dtype, mode):
    ids, masks = tiny_lm.make_batch(8 * world_size + 1, seed=world_size)
    model = tiny_lm.TinyCausalLM(dtype=getattr(torch, dtype))
    tiny_lm.padded_loss(model, ids, masks, mode, gradient_rank.SUM_NORM).backward()
    return tiny_lm.flat_grad(model)


@pytest.mark.parametrize("world_size", [2, 4])
def test_packed_data_parallel_gradient_equals_the_padded_full_batch(tmp_path, world_size):
    with contextlib.ExitStack() as stack:
        sidecars = [
            stack.enter_context(s)
            for s in start_group(tmp_path, world_size, "--collective_timeout=30s")
        ]
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "helpers" / "gradient_rank.py"),
                    str(r),
                    str(world_size),
                    sidecars[r].target,
                    str(port),
                    str(tmp_path / "out"),
                ],
                env=env,
            )
            for r in range(world_size)
        ]
        for proc in procs:
            assert proc.wait(timeout=300) == 0
    grads = torch.load(tmp_path / "out.grads.pt")
    infos = [json.loads((tmp_path / f"out.rank{r}.json").read_text()) for r in range(world_size)]

    # The setup the check needs: several micro-batches per rank, the same count on every rank,
    # and at least one rank with empty micro-batches.
    for i in range(len(infos[0])):
        counts = {info[i]["num_micro_batches"] for info in infos}
        assert len(counts) == 1 and counts.pop() >= 2
        assert all(info[i]["max_tokens"] <= gradient_rank.CAP for info in infos)
    assert infos[0][0]["empty"] > 0

    for key, grad in grads.items():
        dtype, mode, reduction = key.split("/")[:3]
        expected = reference_gradient(world_size, dtype, mode)
        error = float((grad.double() - expected.double()).abs().max())
        scale = max(1.0, float(expected.abs().max()))
        if key.endswith("cross_boundary"):
            assert error > 1e-3 * scale, f"{key}: the cross-boundary bug went unnoticed"
        else:
            assert error <= TOLERANCE[dtype] * scale, f"{key}: max error {error:.3g}"
