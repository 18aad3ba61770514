"""Tree packing through real sidecars: a forest planned by a sidecar equals the in-process plan,
bad forests are INVALID_ARGUMENT naming the node and the sidecar keeps serving, and two ranks of
a group planning their own forests agree on k."""

import concurrent.futures

import numpy as np
import pytest

from packsched import SchedulerClient, SchedulerError, planner
from packsched.tree import Forest, build_forest, forest_from_groups
from sidecar import Sidecar, start_group


def grpo(seed, groups):
    rng = np.random.default_rng(seed)
    return forest_from_groups(
        rng.integers(200, 3000, groups), [rng.integers(50, 800, 8) for _ in range(groups)]
    )


def test_a_sidecar_plans_a_forest_as_the_in_process_planner(tmp_path):
    forest = grpo(1, 12)
    tokens = (forest.rollout_len // 3).tolist()
    with Sidecar(tmp_path) as sidecar, SchedulerClient(sidecar.target, timeout=20) as client:
        remote = client.plan(1, forest, 8192, loss_tokens=tokens, loss_mode="sample_mean")
        local = planner.plan_local(forest, 8192, loss_tokens=tokens, loss_mode="sample_mean")
        assert remote.num_micro_batches == local.num_micro_batches
        assert remote.forwarded_tokens == local.forwarded_tokens == forest.unique_tokens
        assert np.allclose(remote.loss_weights, local.loss_weights)
        # The token accounting, through the sidecar as in process, from the plan's own figures.
        assert remote.tokens == local.tokens
        assert remote.tokens.logical == forest.rollout_tokens
        assert remote.tokens.forwarded == forest.unique_tokens
        assert remote.tokens.executed == sum(mb.meta.total for mb in remote.micro_batches)
        assert remote.tokens.loss_bearing == sum(tokens)
        assert remote.tokens.tree_token_ratio == forest.unique_tokens / forest.rollout_tokens
        flat = client.plan(5, forest.rollout_len, 8192, loss_tokens=tokens)
        assert flat.tokens.logical == flat.tokens.forwarded == forest.rollout_tokens
        assert flat.tokens.loss_bearing == sum(tokens)
        assert flat.tokens.tree_token_ratio == 1.0
        for a, b in zip(remote.micro_batches, local.micro_batches):
            assert a.meta.indices == b.meta.indices
            assert np.array_equal(a.nodes, b.nodes)
            assert np.array_equal(a.subtree_end, b.subtree_end)
            assert np.array_equal(a.rollouts, b.rollouts)
        fixed = client.partition(forest, remote.num_micro_batches + 1, 8192)
        assert fixed.num_micro_batches == remote.num_micro_batches + 1
        balanced = client.balance_batch(forest, 2, 8192)
        held = sorted(r for rank in balanced.ranks for r in rank.indices)
        assert held == list(range(forest.num_rollouts))
        # Fewer rollouts than ranks: the ranks without one get micro-batches named filler.
        few = client.balance_batch(forest_from_groups([100], [[10, 20, 30]]), 8, 8192)
        fillers = [all(mb.meta.filler for mb in rank.plan.micro_batches) for rank in few.ranks]
        assert sum(fillers) == 5
        for rank, filler in zip(few.ranks, fillers):
            assert (not rank.indices) == filler

        # A bad forest names the node; the sidecar keeps serving.
        bad = Forest(forest.node_len, forest.node_parent, forest.rollout_leaf)
        object.__setattr__(bad, "node_parent", np.array([-1, 5] + [0] * (forest.num_nodes - 2)))
        with pytest.raises(SchedulerError) as e:
            client.plan(2, bad, 8192)
        assert e.value.code == "INVALID_ARGUMENT"
        assert "node 1 has node_parent = 5" in e.value.message
        cp = client.plan(3, forest, 8192, context_parallel=2)  # pieces aligned to 2 * cp
        local_cp = planner.plan_local(forest, 8192, context_parallel=2)
        for a, b in zip(cp.micro_batches, local_cp.micro_batches):
            assert a.meta.cu_seqlens_aligned == b.meta.cu_seqlens_aligned
            assert all(c % 4 == 0 for c in a.meta.cu_seqlens_aligned)
        assert client.plan(4, forest, 8192).num_micro_batches == local.num_micro_batches

        # A forest with no rollouts is nothing to plan, as in process and in the CLI.
        empty = Forest(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        for call in (
            lambda: client.plan(6, empty, 8192),
            lambda: client.balance_batch(empty, 2, 8192),
        ):
            with pytest.raises(SchedulerError) as e:
                call()
            assert e.value.code == "INVALID_ARGUMENT", e.value.message
            assert "forest: no rollouts (rollout_leaf is empty): nothing to plan" in e.value.message


def test_two_ranks_planning_forests_agree_on_k(tmp_path):
    forests = [grpo(2, 24), build_forest([[1, 2, 3], [1, 2, 4]])]
    group = start_group(tmp_path, 2, "--collective_timeout=30s")
    try:

        def plan(rank):
            with SchedulerClient(group[rank].target, timeout=60) as client:
                return client.plan(7, forests[rank], 4096, stream="trees")

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            plans = list(pool.map(plan, range(2)))
        bounds = [planner.local_bound(f, 4096).k for f in forests]
        assert bounds[0] > bounds[1]
        for p in plans:
            assert p.num_micro_batches == max(bounds)
            assert len(p.micro_batches) == max(bounds)
        assert plans[1].local_num_micro_batches == bounds[1]
    finally:
        for sidecar in group:
            sidecar.stop()
