"""The tree shard map and kernels of context parallelism (packsched._tree_cp) against the unsharded
tree kernels: on forests planned with context_parallel = cp, for cp = 1, 2, 3, 4, every rank's
row map holds rows / cp rows and together they hold each row once; the shard attention gives the
unsharded tree attention's output row for row and, summed over the ranks, its gradients (float64);
the shard losses add up to the micro-batch's weighted loss and its logits' gradient; a flat
segment's map is segment_rows' head-tail map.
"""

import pathlib
import sys

import numpy as np
import pytest
import torch

from packsched import planner, tree_kernels
from packsched._cp_layout import segment_rows

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "helpers"))

import tree_layout  # noqa: E402

CPS = [1, 2, 3, 4]


def planned_layouts(cp, seed, shape):
    rng = np.random.default_rng(seed)
    if shape == "grpo":
        forest = tree_layout.grpo_forest(
            rng, groups=3, n=4, prompt_len=(5, 40), completion_len=(1, 20)
        )
    else:
        forest = tree_layout.multiturn_forest(rng, trees=3, depth=3, turn_len=(1, 12))
    tree_forest, rollouts = tree_layout.to_tree_forest(forest, forest.roots())
    # align_total_to leaves a tail after the pieces: one more segment of the shard map.
    plan = planner.plan_local(
        tree_forest, 10_000, context_parallel=cp, align_to=2 * cp, align_total_to=16 * cp
    )
    return forest, tree_layout.planner_layouts(tree_forest, rollouts, plan)


@pytest.mark.parametrize("cp", CPS)
def test_flat_segment_map_is_the_head_tail_map(cp):
    for length in range(0, 12 * cp + 1, 2 * cp):
        for rank in range(cp):
            assert tree_kernels.tree_segment_rows(np.arange(length), cp, rank) == segment_rows(
                length, cp, rank
            )


@pytest.mark.parametrize("cp", CPS)
@pytest.mark.parametrize("shape", ["grpo", "multiturn"])
def test_row_maps_split_every_piece_equally(cp, shape):
    _, layouts = planned_layouts(cp, 11, shape)
    for layout in layouts:
        maps = [tree_kernels.tree_cp_rows(layout.cu, layout.positions, cp, r) for r in range(cp)]
        assert all(len(m) * cp == layout.cu[-1] for m in maps)
        assert sorted(np.concatenate(maps).tolist()) == list(range(layout.cu[-1]))
        for a, b in zip(layout.cu, layout.cu[1:]):
            for m in maps:  # every rank holds 1 / cp of every piece
                assert ((m >= a) & (m < b)).sum() * cp == b - a


def test_bad_segment_length_names_the_segment():
    with pytest.raises(ValueError, match="segment 1 has length 6"):
        tree_kernels.tree_cp_rows([0, 8, 14], np.arange(14), 2, 0)
    with pytest.raises(ValueError, match="rank must be in"):
        tree_kernels.tree_segment_rows(np.arange(8), 2, 2)


def _tensors(layout):
    cu = torch.tensor(layout.cu, dtype=torch.int32)
    subtree_end = torch.tensor(layout.subtree_end, dtype=torch.int32)
    max_seqlen = max(b - a for a, b in zip(layout.cu, layout.cu[1:]))
    return cu, subtree_end, max_seqlen


@pytest.mark.parametrize("cp", CPS)
@pytest.mark.parametrize("shape", ["grpo", "multiturn"])
def test_shard_attention_is_the_unsharded_tree_attention(cp, shape):
    _, layouts = planned_layouts(cp, 5 + cp, shape)
    gen = torch.Generator().manual_seed(cp)
    for layout in layouts:
        cu, subtree_end, max_seqlen = _tensors(layout)
        rows = layout.cu[-1]

        def leaf(*shape):
            return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

        q, k, v = leaf(rows, 4, 8), leaf(rows, 2, 8), leaf(rows, 2, 8)
        d_out = torch.randn(rows, 4, 8, generator=gen, dtype=torch.float64)
        kw = dict(cu_seqlens_host=layout.cu)
        out = tree_kernels.tree_attention(q, k, v, cu, max_seqlen, subtree_end, **kw)
        expected = torch.autograd.grad((out * d_out).sum(), (q, k, v))

        maps = [tree_kernels.tree_cp_rows(layout.cu, layout.positions, cp, r) for r in range(cp)]
        shards = []
        for m in maps:
            shard = tree_kernels.tree_cp_attention(
                tree_kernels.tree_cp_shard(q, m), k, v, m, cu, max_seqlen, subtree_end, **kw
            )
            (shard * tree_kernels.tree_cp_shard(d_out, m)).sum().backward()
            shards.append(shard.detach())
        assert torch.equal(tree_kernels.tree_cp_unshard(shards, maps), out.detach())
        for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), expected):
            err = float((got - want).abs().max())
            assert err <= 1e-12 * max(1.0, float(want.abs().max())), f"d{name}: {err:.3g}"


@pytest.mark.parametrize("cp", CPS)
def test_shard_losses_add_up_to_the_micro_batch_loss(cp):
    forest, layouts = planned_layouts(cp, 3, "multiturn")
    gen = torch.Generator().manual_seed(cp)
    for layout in layouts:
        data = [forest.rollout(r) for r in layout.rollouts]
        weights = torch.rand(len(data), generator=gen, dtype=torch.float64).tolist()
        targets = tree_kernels.tree_targets(
            layout.rows, [x for x, _ in data], weights, loss_masks=[m for _, m in data]
        )
        logits = torch.randn(layout.cu[-1], 61, generator=gen, dtype=torch.float64)
        logits.requires_grad_()
        per_target = tree_kernels.multi_target_cross_entropy(
            logits, torch.as_tensor(targets.rows), torch.as_tensor(targets.labels)
        )
        full = (per_target * torch.as_tensor(targets.weights)).sum()
        (expected,) = torch.autograd.grad(full, logits)
        total, held = 0.0, []
        for r in range(cp):
            m = tree_kernels.tree_cp_rows(layout.cu, layout.positions, cp, r)
            mine = tree_kernels.tree_cp_targets(targets, m)
            assert np.all(np.diff(mine.rows) >= 0)
            loss, each = tree_kernels.tree_cp_cross_entropy(
                tree_kernels.tree_cp_shard(logits, m), mine
            )
            torch.testing.assert_close(each, per_target.detach()[mine.index], rtol=0, atol=0)
            loss.backward()
            total += float(loss.detach())
            held.append(mine.index)
        assert sorted(np.concatenate(held).tolist()) == list(range(len(targets.rows)))
        full = float(full.detach())
        assert abs(total - full) <= 1e-12 * max(1.0, abs(full))
        assert float((logits.grad - expected).abs().max()) <= 1e-13


@pytest.mark.parametrize("shape", ["grpo", "multiturn"])
def test_two_ranks_split_every_piece_within_one_row_of_work(shape):
    # At cp = 2 rank 0's head and tail runs of a = 0 and a = L / 2 hold the two halves, whose
    # work sums to the piece's; one step of a moves one row's work, so some a is within half a
    # row's work of an equal split.
    for seed in range(4):
        _, layouts = planned_layouts(2, 100 + seed, shape)
        for layout in layouts:
            pos = np.asarray(layout.positions, dtype=np.int64)
            for a, b in zip(layout.cu, layout.cu[1:]):
                work = [
                    sum(int((pos[a + lo : a + hi] + 1).sum()) for lo, hi in runs)
                    for runs in (tree_kernels.tree_segment_rows(pos[a:b], 2, r) for r in (0, 1))
                ]
                assert abs(work[0] - work[1]) <= int(pos[a:b].max()) + 1
