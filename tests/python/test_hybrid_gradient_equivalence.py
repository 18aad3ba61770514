"""End to end: packing a hybrid model (Gated DeltaNet, Mamba-2 and attention layers) changes
which tokens are forwarded, never the gradient, when every recurrence starts from zero state at
a sequence start and a tree child continues from its parent's end.

Two data-parallel ranks, each with its own real sidecar (one rank group over Gloo on loopback),
plan their share of a forest's trees and run the tiny hybrid model of helpers/hybrid_lm.py
tree-packed (each shared prompt and turn forwarded once) and flat-packed (every rollout a
sequence), then all-reduce their gradients (helpers/hybrid_gradient_rank.py). In float64 each
equals, within
1e-10 of the largest entry, the gradient of the same model over every rollout padded on its own
with the per-sequence definitions (helpers/hybrid_reference.py), for every loss mode (and both
DP reductions for token_mean), on GRPO groups (n = 8) and branching multi-turn trees of depth
3. It differs when tree children start from zero state, or when a flat row's sequences inherit
their predecessor's state (the negative controls).
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

import hybrid_lm  # noqa: E402
import tiny_lm  # noqa: E402
import tree_gradient_rank  # noqa: E402

WORLD_SIZE = 2


def reference_gradients(shape):
    """Per loss mode: the padded per-rollout gradient of the whole global forest."""
    forest = tree_gradient_rank.global_forest(shape)
    rollouts = [forest.rollout(r) for r in range(len(forest.rollout_leaf))]
    batch, seqlen = len(rollouts), max(len(x) for x, _ in rollouts)
    ids = torch.zeros(batch, seqlen, dtype=torch.int64)
    real = torch.zeros(batch, seqlen, dtype=torch.bool)
    trained = torch.zeros(batch, seqlen, dtype=torch.bool)
    for b, (x, m) in enumerate(rollouts):
        ids[b, : len(x)], real[b, : len(x)] = torch.as_tensor(x), True
        trained[b, : len(x)] = torch.as_tensor(m)
    labels = torch.where(real[:, 1:] & trained[:, 1:], ids[:, 1:], tiny_lm.IGNORE)
    model = hybrid_lm.TinyHybridLM()
    positions = torch.arange(seqlen).expand(batch, seqlen)
    logits = model(ids, positions, hybrid_lm.Padded(real))
    per_token = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=tiny_lm.IGNORE,
        reduction="none",
    ).view(batch, seqlen - 1)
    counts = [int(c) for c in (labels != tiny_lm.IGNORE).sum(dim=1)]
    out = {}
    for mode in tree_gradient_rank.MODES:
        objective = tiny_lm.direct_objective(
            list(per_token.sum(dim=1)), counts, mode, tree_gradient_rank.SUM_NORM
        )
        grads = torch.autograd.grad(objective, list(model.parameters()), retain_graph=True)
        out[mode] = torch.cat([g.reshape(-1) for g in grads])
    return out


def test_hybrid_model_tree_and_flat_packed_gradients_equal_the_padded_rollouts(tmp_path):
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
                    str(HERE / "helpers" / "hybrid_gradient_rank.py"),
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

    # The setup the proof needs: several micro-batches on a rank, shared tokens forwarded once
    # (fewer tree rows than flat rows), and branch points whose states are kept.
    by_key = {i["key"]: i for i in infos[1]}
    for shape in ("grpo", "multiturn"):
        tree, flat = by_key[f"{shape}/sum/sum/tree"], by_key[f"{shape}/sum/sum/flat"]
        assert tree["micro_batches"] >= 2 and flat["micro_batches"] >= 2
        assert tree["rows"] < flat["rows"] and tree["states_alive"] >= 1

    negatives = 0
    references = {shape: reference_gradients(shape) for shape in ("grpo", "multiturn")}
    for key, grad in grads.items():
        shape, mode = key.split("/")[:2]
        expected = references[shape][mode]
        error = float((grad - expected).abs().max())
        scale = max(1.0, float(expected.abs().max()))
        if key.endswith(("zero_child", "inherited_state")):
            negatives += 1
            assert error > 1e-6 * scale, f"{key}: the broken state rule went unnoticed"
        else:
            assert error <= 1e-10 * scale, f"{key}: max error {error:.3g}"
    assert negatives == 4 and len(grads) == 28
