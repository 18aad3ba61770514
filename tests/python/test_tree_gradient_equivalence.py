"""End to end: tree packing changes which tokens are forwarded, never the gradient.

Two data-parallel ranks, each with its own real sidecar (one rank group over Gloo on loopback),
plan their share of a forest's trees, run every micro-batch tree-packed (each shared prompt and
turn forwarded once: tree attention, depths, multi-target cross entropy weighted by the plan's
per-rollout loss weights) and all-reduce their gradients. In float64 the result equals, within
1e-10 of the largest entry, the gradient of the same model on every rollout padded on its own in
one process, for every loss mode and both DP reductions, on GRPO groups (n = 8, shared prompts)
and on branching multi-turn trees of depth 3. The test fails when a branch can see its sibling
and when a branching row's targets are merged (the negative controls must differ).

The micro-batch plan is helpers/tree_gradient_rank.py's plan_forest: the sidecar's forest plan
(packsched.tree: layouts from the TreeMicroBatch rows, loss weights per rollout), pieces of at
most CAP unique tokens; test_tree_layout_agreement.py checks that its layout is the reference
builder's (helpers/tree_layout.py).
"""

import contextlib
import json
import os
import pathlib
import subprocess
import sys

import torch

from sidecar import free_port, start_group

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "client" / "python" / "examples"))
sys.path.insert(0, str(HERE / "helpers"))

import tiny_lm  # noqa: E402
import tree_gradient_rank  # noqa: E402

WORLD_SIZE = 2


def reference_gradient(shape, mode):
    forest = tree_gradient_rank.global_forest(shape)
    rollouts = [forest.rollout(r) for r in range(len(forest.rollout_leaf))]
    ids = [torch.as_tensor(x) for x, _ in rollouts]
    masks = [torch.as_tensor(m) for _, m in rollouts]
    model = tiny_lm.TinyCausalLM(dtype=torch.float64)
    tiny_lm.padded_loss(model, ids, masks, mode, tree_gradient_rank.SUM_NORM).backward()
    return tiny_lm.flat_grad(model)


def test_tree_packed_data_parallel_gradient_equals_the_padded_rollouts(tmp_path):
    with contextlib.ExitStack() as stack:
        sidecars = [
            stack.enter_context(s)
            for s in start_group(tmp_path, WORLD_SIZE, "--collective_timeout=30s")
        ]
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "helpers" / "tree_gradient_rank.py"),
                    str(r),
                    str(WORLD_SIZE),
                    sidecars[r].target,
                    str(port),
                    str(tmp_path / "out"),
                ],
                env=env,
            )
            for r in range(WORLD_SIZE)
        ]
        try:
            for proc in procs:
                assert proc.wait(timeout=300) == 0
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    grads = torch.load(tmp_path / "out.grads.pt")
    infos = [json.loads((tmp_path / f"out.rank{r}.json").read_text()) for r in range(WORLD_SIZE)]

    # The setup the proof needs: several micro-batches on a rank, and shared tokens forwarded once.
    assert max(info["micro_batches"] for info in infos[1]) >= 2
    assert all(info["rows"] < info["unshared_tokens"] for info in infos[1])

    negatives = 0
    for key, grad in grads.items():
        shape, mode = key.split("/")[:2]
        expected = reference_gradient(shape, mode)
        error = float((grad - expected).abs().max())
        scale = max(1.0, float(expected.abs().max()))
        if key.endswith(("sibling_visible", "merged_targets")):
            negatives += 1
            assert error > 1e-6 * scale, f"{key}: the broken contract went unnoticed"
        else:
            assert error <= 1e-10 * scale, f"{key}: max error {error:.3g}"
    assert negatives == 4 and len(grads) == 24
