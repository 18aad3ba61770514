"""End to end: context parallelism over tree-packed micro-batches changes where the work runs,
never the gradient.

CP = 2 and 4 as gloo processes inside DP = 2 (helpers/tree_cp_gradient_rank.py): every process
holds its tree shard (packsched.tree_kernels.tree_cp_rows) of each micro-batch of its DP rank's
forest plan (planned with context_parallel = cp), all-gathers the keys and values of its CP group,
runs its queries under the tree mask (tree_cp_attention) and backwards the weighted loss of its
rows' targets (built over the whole micro-batch, then sharded). Summed over all processes, the
gradient equals that of the same model on every rollout padded on its own in one process
(float64, 1e-10 of the largest entry) for every loss mode, on GRPO groups and branching
multi-turn trees (tests/python/test_tree_gradient_equivalence.py's forests). The same run with
rows that see their sibling branches' keys must differ (the negative control).
"""

import functools
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

import test_tree_gradient_equivalence  # noqa: E402

DP = 2
reference_gradient = functools.lru_cache(test_tree_gradient_equivalence.reference_gradient)


@pytest.mark.parametrize("cp", [2, 4])
def test_tree_context_parallel_gradient_equals_the_padded_rollouts(tmp_path, cp):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "helpers" / "tree_cp_gradient_rank.py"),
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
    checked, negatives = set(), 0
    for key, grad in grads.items():
        if key.endswith("/micro_batches"):
            assert int(grad) >= 2  # several micro-batches per rank
            continue
        shape, mode = key.split("/")[:2]
        expected = reference_gradient(shape, mode)
        error = float((grad - expected).abs().max())
        scale = max(1.0, float(expected.abs().max()))
        if key.endswith("sibling_visible"):
            negatives += 1
            assert error > 1e-6 * scale, f"cp={cp} {key}: a rank saw a sibling, unnoticed"
        else:
            assert error <= 1e-10 * scale, f"cp={cp} {key}: max error {error:.3g}"
            checked.add(mode)
    assert negatives == 2 and len(checked) == 5
