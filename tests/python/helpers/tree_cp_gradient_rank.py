"""One process of the tree-packing context-parallel gradient proof
(tests/python/test_tree_cp_gradient.py): data-parallel rank dp = rank // cp, CP rank c = rank % cp.

For every (forest shape, loss mode, dp_reduction) each process plans its DP rank's share of the
trees of tree_gradient_rank's global forest with the in-process planner and context_parallel = cp
(k agreed over the DP ranks and the loss weights from the summed counts, as the sidecar gives
them), and for each micro-batch keeps its tree shard (tree_cp_rows) of the ids and depths,
all-gathers the keys and values of its CP group (gloo; tree_cp_unshard), runs tree_cp_attention,
and backwards the weighted loss of its targets (the micro-batch's tree_targets, built before
sharding, then tree_cp_targets). The gradients are summed over all processes; rank 0 saves them.
The negative control gives every row its whole piece as subtree (a rank's queries see sibling
branches' keys).

Usage: tree_cp_gradient_rank.py RANK CP DP DIST_PORT OUT_PREFIX
"""

import pathlib
import sys

import torch
import torch.distributed as dist

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2] / "client" / "python" / "examples"))

import tiny_lm  # noqa: E402
import tree_gradient_rank  # noqa: E402
import tree_layout  # noqa: E402
from packsched import planner, tree_kernels  # noqa: E402

CAP = 400


def configs():
    for shape in ("grpo", "multiturn"):
        for mode in tree_gradient_rank.MODES:
            yield shape, mode, "sum", None
        yield shape, "token_mean", "mean", None
        yield shape, "token_mean", "sum", "sibling_visible"


def plan_share(forest, dp, dp_size, cp, mode, reduction):
    """This DP rank's layouts and per-rollout loss weights (by global index)."""
    shares = [
        tree_layout.to_tree_forest(forest, tree_gradient_rank.share(forest, d, dp_size))
        for d in range(dp_size)
    ]
    options = dict(
        loss_mode=mode,
        dp_reduction=reduction,
        sum_norm_constant=tree_gradient_rank.SUM_NORM,
        context_parallel=cp,
    )

    def loss_tokens(rollouts):
        return [int(forest.rollout(r)[1][1:].sum()) for r in rollouts]

    bounds = [
        planner.local_bound(tf, CAP, loss_tokens=loss_tokens(rs), **options) for tf, rs in shares
    ]
    k = max(b.k for b in bounds)
    counts = tuple(sum(b.loss_counts[j] for b in bounds) for j in range(2))
    tree_forest, rollouts = shares[dp]
    plan = planner.partition(
        tree_forest,
        k,
        CAP,
        global_counts=counts,
        world_size=dp_size,
        loss_tokens=loss_tokens(rollouts),
        **options,
    )
    weights = dict(zip(rollouts, plan.loss_weights))
    return tree_layout.planner_layouts(tree_forest, rollouts, plan), weights


class _Gather(torch.autograd.Function):
    """All-gather the CP group's shards into the whole micro-batch (tree_cp_unshard); backward:
    the group's gradients summed, this rank's rows kept (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, shard, maps, rank, group):
        parts = [torch.empty_like(shard) for _ in maps]
        dist.all_gather(parts, shard.contiguous(), group=group)
        ctx.args = (maps, rank, group)
        return tree_kernels.tree_cp_unshard(parts, maps)

    @staticmethod
    def backward(ctx, grad):
        maps, rank, group = ctx.args
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=group)
        return tree_kernels.tree_cp_shard(grad, maps[rank]), None, None, None


def shard_backward(model, forest, layout, weights, cp, c, group):
    maps = [tree_kernels.tree_cp_rows(layout.cu, layout.positions, cp, r) for r in range(cp)]
    mine = maps[c]
    ids = tree_kernels.tree_cp_shard(torch.as_tensor(layout.ids, dtype=torch.int64), mine)
    positions = torch.as_tensor(layout.positions, dtype=torch.int64)
    x = model.embed(ids) + model.pos(tree_kernels.tree_cp_shard(positions, mine))
    q, k, v = model._qkv(model.norm1(x))
    cu = torch.tensor(layout.cu, dtype=torch.int32)
    subtree_end = torch.tensor(layout.subtree_end, dtype=torch.int32)
    max_seqlen = max(b - a for a, b in zip(layout.cu, layout.cu[1:]))
    a = tree_kernels.tree_cp_attention(
        q,
        _Gather.apply(k, maps, c, group),
        _Gather.apply(v, maps, c, group),
        mine,
        cu,
        max_seqlen,
        subtree_end,
        cu_seqlens_host=layout.cu,
    )
    x = x + model.out(a.reshape(len(ids), -1))
    logits = model.head(x + model.mlp(model.norm2(x)))
    data = [forest.rollout(r) for r in layout.rollouts]
    targets = tree_kernels.tree_targets(
        layout.rows,
        [t for t, _ in data],
        [weights[r] for r in layout.rollouts],
        loss_masks=[m for _, m in data],
    )
    loss, _ = tree_kernels.tree_cp_cross_entropy(
        logits, tree_kernels.tree_cp_targets(targets, mine)
    )
    loss.backward()


def main():
    rank, cp, dp_size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    port, out = int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cp * dp_size
    )
    groups = [dist.new_group(list(range(d * cp, (d + 1) * cp))) for d in range(dp_size)]
    dp, c = rank // cp, rank % cp
    grads = {}
    for shape, mode, reduction, negative in configs():
        forest = tree_gradient_rank.global_forest(shape)
        layouts, weights = plan_share(forest, dp, dp_size, cp, mode, reduction)
        model = tiny_lm.TinyCausalLM(dtype=torch.float64)
        for layout in layouts:
            if not layout.rollouts:  # the whole CP group skips it alike
                continue
            if negative == "sibling_visible":
                tree_gradient_rank.sibling_visible(layout)
            shard_backward(model, forest, layout, weights, cp, c, groups[dp])
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            if reduction == "mean":
                p.grad /= dp_size
        key = f"{shape}/{mode}/{reduction}" + (f"/{negative}" if negative else "")
        grads[key] = tiny_lm.flat_grad(model)
        grads[f"{key}/micro_batches"] = torch.tensor(len(layouts))
    if rank == 0:
        torch.save(grads, f"{out}.grads.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    from rank_exit import run

    run(main)
