"""group_ids with a forest (docs/design.md "Tree packing", coordinator mode): one per rollout, a
group's rollouts on one rank, no piece holding two groups, every micro-batch within the cap, a
group too large for one rank named; in process (packsched.planner.balance) and through a real
sidecar's BalanceBatch, which give the same plan."""

import numpy as np
import pytest

from packsched import planner
from packsched.client import SchedulerClient, SchedulerError
from packsched.tree import forest_from_groups
from sidecar import Sidecar

W = 8
ALIGN = 8


def mix(trees, n, seed):
    rng = np.random.default_rng(seed)
    return forest_from_groups(
        rng.integers(1000, 3001, trees), [rng.integers(200, 1501, n) for _ in range(trees)]
    )


def union_tokens(forest, rollouts):
    nodes = set()
    for r in rollouts:
        node = int(forest.rollout_leaf[r])
        while node >= 0 and node not in nodes:
            nodes.add(node)
            node = int(forest.node_parent[node])
    return sum(int(forest.node_len[n]) for n in nodes)


def check(forest, group_ids, balanced, cap):
    """The contract from the forest and the layouts; returns the ranks that hold a rollout."""
    rank_of = {}
    seen = np.zeros(len(forest.rollout_leaf), dtype=int)
    held = 0
    for rank, r in enumerate(balanced.ranks):
        assert len(r.plan.micro_batches) == balanced.num_micro_batches
        for part in r.plan.micro_batches:
            begin = part.piece_rollout_begin
            aligned = 0
            for b in range(len(begin) - 1):
                rollouts = part.piece_rollouts[begin[b] : begin[b + 1]].tolist()
                assert len({group_ids[x] for x in rollouts}) == 1, "a piece holds two groups"
                aligned += -(-union_tokens(forest, rollouts) // ALIGN) * ALIGN
            assert aligned <= cap, f"rank {rank}: a micro-batch over the cap"
            for x in part.rollouts.tolist():
                seen[x] += 1
                assert rank_of.setdefault(group_ids[x], rank) == rank, f"group {group_ids[x]}"
        assert sorted(r.indices) == sorted(
            x for p in r.plan.micro_batches for x in p.rollouts.tolist()
        )
        held += bool(r.indices)
    assert (seen == 1).all()
    return held


@pytest.mark.parametrize("trees", [1, 3, 7])
@pytest.mark.parametrize("per_group", [2, 3, 16])
def test_groups_stay_on_one_rank_and_fill_the_ranks_they_can(trees, per_group):
    forest = mix(trees, 16, 10 * trees + per_group)
    group_ids = [r // per_group for r in range(len(forest.rollout_leaf))]
    groups = len(set(group_ids))
    for sync in ("step", "micro_batch"):
        cap = 8192
        balanced = planner.balance(
            forest, W, cap, group_ids=group_ids, sync=sync, align_to=ALIGN, progress=False
        )
        assert check(forest, group_ids, balanced, cap) == min(W, groups)


def test_a_group_too_large_for_one_rank_is_named():
    forest = mix(2, 16, 3)
    group_ids = [7 if r >= 4 else 1 for r in range(32)]
    least = -(-union_tokens(forest, range(4, 32)) // 8192)  # group 7's rank needs as many
    assert least > 2
    planner.balance(forest, W, 8192, group_ids=group_ids, align_to=ALIGN, progress=False)
    with pytest.raises(ValueError, match=r"group_ids: group 7 \(28 rollouts") as e:
        planner.balance(
            forest,
            W,
            8192,
            group_ids=group_ids,
            align_to=ALIGN,
            max_micro_batches=W * least - 1,
            progress=False,
        )
    assert "max_micro_batches" in str(e.value)


def test_a_sidecar_plans_groups_as_the_in_process_planner(tmp_path):
    forest = mix(3, 12, 21)
    group_ids = [(r * 7) % 5 for r in range(len(forest.rollout_leaf))]  # across the trees
    with Sidecar(tmp_path) as sidecar, SchedulerClient(sidecar.target, timeout=20) as client:
        remote = client.balance_batch(forest, 4, 8192, group_ids=group_ids, align_to=ALIGN)
        local = planner.balance(
            forest, 4, 8192, group_ids=group_ids, align_to=ALIGN, progress=False
        )
        assert check(forest, group_ids, remote, 8192) == 4
        assert remote.num_micro_batches == local.num_micro_batches
        assert [sorted(r.indices) for r in remote.ranks] == [sorted(r.indices) for r in local.ranks]
        with pytest.raises(SchedulerError) as e:
            client.balance_batch(
                forest,
                4,
                8192,
                group_ids=group_ids,
                align_to=ALIGN,
                max_micro_batches=2,
            )
        assert e.value.code == "INVALID_ARGUMENT"
        assert "group_ids: group " in e.value.message
