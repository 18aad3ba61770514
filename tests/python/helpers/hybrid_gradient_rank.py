"""One data-parallel rank of the hybrid-model gradient proof
(tests/python/test_hybrid_gradient_equivalence.py).

For every forest shape and loss mode (dp_reduction sum; mean too for token_mean) it takes its
share of the trees of one global forest (helpers/tree_gradient_rank.py's) and runs the tiny
hybrid model (helpers/hybrid_lm.py) twice: tree-packed (the sidecar's forest plan; recurrences
over micro_batch_prev_rows, tree attention, multi-target cross entropy with the plan's
per-rollout weights) and flat-packed (the sidecar's plan over the rollouts as sequences;
flat_prev_rows, varlen attention), all-reduces each gradient over torch.distributed (gloo) and,
on rank 0, saves them. Two negative controls break the state rule on purpose: tree children
that start from zero state, and a flat row whose sequences inherit their predecessor's state.

Usage: hybrid_gradient_rank.py RANK WORLD_SIZE SIDECAR DIST_PORT OUT_PREFIX
"""

import json
import pathlib
import sys

import numpy as np
import torch
import torch.distributed as dist

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hybrid_lm  # noqa: E402
import tree_gradient_rank as trees  # noqa: E402
import tree_layout  # noqa: E402
from packsched import kernels, tree_kernels  # noqa: E402
from packsched.client import SchedulerClient  # noqa: E402

FLAT_CAP = 400


def weighted_loss(model, ids, positions, ops, rows, rollouts, forest, weights):
    """sum over the micro-batch's rollouts of weight x their summed token loss (the loss rule)."""
    data = [forest.rollout(r) for r in rollouts]
    targets = tree_kernels.tree_targets(
        rows,
        [x for x, _ in data],
        [weights[r] for r in rollouts],
        loss_masks=[m for _, m in data],
    )
    logits = model(
        torch.as_tensor(np.asarray(ids), dtype=torch.int64),
        torch.as_tensor(np.asarray(positions), dtype=torch.int64),
        ops,
    )
    loss = kernels.multi_target_cross_entropy(
        logits,
        torch.as_tensor(targets.rows, dtype=torch.int64),
        torch.as_tensor(targets.labels, dtype=torch.int64),
    )
    return (loss * torch.as_tensor(targets.weights, dtype=loss.dtype)).sum()


def tree_backward(client, round_, model, forest, roots, mode, reduction, negative):
    tree_forest, rollouts = tree_layout.to_tree_forest(forest, roots)
    masks = [forest.rollout(r)[1] for r in rollouts]
    plan = client.plan(
        round_, tree_forest, trees.CAP, stream="hybrid-tree",
        loss_tokens=[int(m[1:].sum()) for m in masks], loss_mode=mode, dp_reduction=reduction,
        sum_norm_constant=trees.SUM_NORM,
    )  # fmt: skip
    assert not plan.dropped
    weights = dict(zip(rollouts, plan.loss_weights))
    layouts = tree_layout.planner_layouts(tree_forest, rollouts, plan)
    rows, states = 0, 0
    for mb, layout in zip(plan.micro_batches, layouts):
        if not layout.rollouts:
            continue
        prev = kernels.micro_batch_prev_rows(mb, tree_forest)
        if negative == "zero_child":
            starts = np.asarray(mb.row)[np.asarray(mb.parent) >= 0]
            prev[starts] = -1
        states = max(states, kernels.states_alive(prev))
        rows += len(layout.ids)
        subtree_end = torch.as_tensor(np.asarray(layout.subtree_end), dtype=torch.int32)
        ops = hybrid_lm.Packed(prev, list(layout.cu), subtree_end)
        weighted_loss(
            model, layout.ids, layout.positions, ops, layout.rows, layout.rollouts, forest, weights
        ).backward()
    return {"rows": rows, "states_alive": states, "micro_batches": len(layouts)}


def flat_backward(client, round_, model, forest, roots, mode, reduction, negative):
    rollouts = [r for root in roots for r in forest.rollouts_of(root)]
    data = [forest.rollout(r) for r in rollouts]
    plan = client.plan(
        round_, [len(x) for x, _ in data], FLAT_CAP, stream="hybrid-flat",
        loss_tokens=[int(m[1:].sum()) for _, m in data], loss_mode=mode, dp_reduction=reduction,
        sum_norm_constant=trees.SUM_NORM,
    )  # fmt: skip
    weights = dict(zip(rollouts, plan.loss_weights))
    rows = 0
    for indices, meta in zip(plan.micro_batches, plan.metadata):
        if meta.empty:
            continue
        cu = [int(c) for c in meta.cu_seqlens]
        held = [rollouts[i] for i in indices]
        prev = kernels.flat_prev_rows(cu)
        if negative == "inherited_state":
            prev = np.arange(-1, cu[-1] - 1, dtype=np.int32)
            prev[0] = -1
        ids = np.concatenate([data[i][0] for i in indices])
        positions = np.concatenate([np.arange(b - a) for a, b in zip(cu, cu[1:])])
        seq_rows = [np.arange(a, b) for a, b in zip(cu, cu[1:])]
        rows += len(ids)
        ops = hybrid_lm.Packed(prev, cu)
        weighted_loss(model, ids, positions, ops, seq_rows, held, forest, weights).backward()
    return {"rows": rows, "micro_batches": plan.num_micro_batches}


def configs():
    for shape in ("grpo", "multiturn"):
        for mode, reduction in [(m, "sum") for m in trees.MODES] + [("token_mean", "mean")]:
            for packing in ("tree", "flat"):
                yield shape, mode, reduction, packing, None
        yield shape, "token_mean", "sum", "tree", "zero_child"
        yield shape, "token_mean", "sum", "flat", "inherited_state"


def main():
    rank, world_size = int(sys.argv[1]), int(sys.argv[2])
    sidecar, port, out = sys.argv[3], int(sys.argv[4]), sys.argv[5]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    grads, info = {}, []
    with SchedulerClient(sidecar, timeout=60) as client:
        for round_, (shape, mode, reduction, packing, negative) in enumerate(configs()):
            forest = trees.global_forest(shape)
            roots = trees.share(forest, rank, world_size)
            model = hybrid_lm.TinyHybridLM()
            run = tree_backward if packing == "tree" else flat_backward
            facts = run(client, round_, model, forest, roots, mode, reduction, negative)
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                if reduction == "mean":
                    p.grad /= world_size
            key = f"{shape}/{mode}/{reduction}/{packing}" + (f"/{negative}" if negative else "")
            grads[key] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            info.append(dict(facts, key=key))
    if rank == 0:
        torch.save(grads, f"{out}.grads.pt")
    pathlib.Path(f"{out}.rank{rank}.json").write_text(json.dumps(info))
    dist.destroy_process_group()


if __name__ == "__main__":
    from rank_exit import run

    run(main)
