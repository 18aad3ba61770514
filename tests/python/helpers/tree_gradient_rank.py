"""One data-parallel rank of the tree-packing gradient proof
(tests/python/test_tree_gradient_equivalence.py).

For every (forest shape, loss mode, dp_reduction) it takes its share of the trees of one global
forest, plans them through its own sidecar (plan_forest: the sidecar's forest plan, layouts and
loss weights), runs each micro-batch tree-packed
(tree attention, depths, multi-target cross entropy weighted by the plan's per-rollout loss
weights), all-reduces the gradients over torch.distributed (gloo) and, on rank 0, saves them.
Two negative controls break the contract on purpose: a branch that sees its sibling, and a
branching row whose targets are merged into one.

Usage: tree_gradient_rank.py RANK WORLD_SIZE SIDECAR DIST_PORT OUT_PREFIX
"""

import json
import pathlib
import sys

import numpy as np
import torch
import torch.distributed as dist

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2] / "client" / "python" / "examples"))

import tiny_lm  # noqa: E402
import tree_layout  # noqa: E402
import tree_packing  # noqa: E402
from packsched import tree_kernels  # noqa: E402
from packsched.client import SchedulerClient  # noqa: E402

MODES = ["token_mean", "sample_mean", "seq_sum", "sum", "sum_norm"]
SUM_NORM = 64.0
CAP = 400  # unique tokens per micro-batch: several micro-batches per rank


def global_forest(shape):
    """The same forest on every rank: GRPO groups (n = 8, shared prompts) or branching
    multi-turn trees of depth 3 below the prompt."""
    rng = np.random.default_rng(7)
    if shape == "grpo":
        return tree_layout.grpo_forest(
            rng, groups=6, n=8, prompt_len=(20, 120), completion_len=(1, 30)
        )
    return tree_layout.multiturn_forest(rng, trees=8, depth=3, turn_len=(1, 25))


def share(forest, rank, world_size):
    """Rank 0 gets one tree; the others split the rest."""
    roots = forest.roots()
    if rank == 0:
        return roots[:1]
    return roots[1:][rank - 1 :: world_size - 1]


def plan_forest(client, round_, forest, roots, cap, mode, reduction):
    """This rank's micro-batches as packed layouts (tree_layout.Layout: ids, positions,
    subtree_end, cu, and per held rollout its global index and rows) and the loss weight of each
    of its rollouts (by global index), both from the sidecar's forest plan: this rank's trees as
    a packsched.tree.Forest, planned in pieces of at most ``cap`` unique tokens (the rank group
    agrees k and the global loss counts), each micro-batch's layout from its TreeMicroBatch
    (input_ids, rows, rollout_rows) and the weights per rollout from plan.loss_weights."""
    tree_forest, rollouts = tree_layout.to_tree_forest(forest, roots)
    masks = [forest.rollout(r)[1] for r in rollouts]
    plan = client.plan(
        round_,
        tree_forest,
        cap,
        stream="tree-gradient",
        loss_tokens=[int(m[1:].sum()) for m in masks],
        loss_mode=mode,
        dp_reduction=reduction,
        sum_norm_constant=SUM_NORM,
    )
    assert not plan.dropped
    weights = dict(zip(rollouts, plan.loss_weights))
    return tree_layout.planner_layouts(tree_forest, rollouts, plan), weights


def sibling_visible(layout):
    """Breaks the mask: every row's subtree is its whole piece (plain causal over the piece)."""
    for a, b in zip(layout.cu, layout.cu[1:]):
        layout.subtree_end[a:b] = [b] * (b - a)


def merge_branch_targets(targets):
    """Breaks the loss: a row with several targets keeps only its first label, with their summed
    weight (one next token per row, as flat packing has)."""
    rows, first = np.unique(targets.rows, return_index=True)
    weights = np.add.reduceat(targets.weights, first)
    return tree_kernels.TreeTargets(rows, targets.labels[first], weights, None)


def tree_backward(model, forest, layouts, weights, negative):
    for layout in layouts:
        if not layout.rollouts:  # an empty micro-batch (the agreed k is above this rank's own)
            continue
        if negative == "sibling_visible":
            sibling_visible(layout)
        data = [forest.rollout(r) for r in layout.rollouts]
        targets = tree_kernels.tree_targets(
            layout.rows,
            [ids for ids, _ in data],
            [weights[r] for r in layout.rollouts],
            loss_masks=[m for _, m in data],
        )
        if negative == "merged_targets":
            targets = merge_branch_targets(targets)
        loss, _ = tree_packing.tree_loss(model, layout, targets)
        loss.backward()


def configs():
    for shape in ("grpo", "multiturn"):
        for mode in MODES:
            for reduction in ("sum", "mean"):
                yield shape, mode, reduction, None
        for negative in ("sibling_visible", "merged_targets"):
            yield shape, "token_mean", "sum", negative


def main():
    rank, world_size = int(sys.argv[1]), int(sys.argv[2])
    sidecar, port, out = sys.argv[3], int(sys.argv[4]), sys.argv[5]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    grads, info = {}, []
    with SchedulerClient(sidecar, timeout=60) as client:
        for round_, (shape, mode, reduction, negative) in enumerate(configs()):
            forest = global_forest(shape)
            roots = share(forest, rank, world_size)
            layouts, weights = plan_forest(client, round_, forest, roots, CAP, mode, reduction)
            model = tiny_lm.TinyCausalLM(dtype=torch.float64)
            tree_backward(model, forest, layouts, weights, negative)
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                if reduction == "mean":
                    p.grad /= world_size
            key = f"{shape}/{mode}/{reduction}" + (f"/{negative}" if negative else "")
            grads[key] = tiny_lm.flat_grad(model)
            rows = sum(len(layout.ids) for layout in layouts)
            unshared = sum(
                len(forest.rollout(r)[0]) for root in roots for r in forest.rollouts_of(root)
            )
            info.append(
                {
                    "key": key,
                    "micro_batches": len(layouts),
                    "rows": rows,
                    "unshared_tokens": unshared,
                }
            )
    if rank == 0:
        torch.save(grads, f"{out}.grads.pt")
    pathlib.Path(f"{out}.rank{rank}.json").write_text(json.dumps(info))
    dist.destroy_process_group()


if __name__ == "__main__":
    from rank_exit import run

    run(main)
