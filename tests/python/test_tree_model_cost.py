"""packsched.planner.balance over a forest with model_config, in process and through a sidecar:
the weights the model gives the forest (its rollouts flat, server/planner/model_cost.h), a forest
of chains balanced as its lengths, and group_ids still refused."""

import numpy as np
import pytest

from packsched import SchedulerClient, SchedulerError, planner
from packsched.model_cost import model_cost
from packsched.tree import Forest, forest_from_groups
from model_configs import LLAMA_8B
from sidecar import Sidecar


def grpo(seed, groups, per_group=8):
    rng = np.random.default_rng(seed)
    return forest_from_groups(
        rng.integers(200, 3000, groups), [rng.integers(50, 2000, per_group) for _ in range(groups)]
    )


def chains(lengths):
    n = len(lengths)
    return Forest(np.array(lengths), np.full(n, -1), np.arange(n))


def round_up(x, to):
    return (x + to - 1) // to * to


def same_balance(a, b):
    assert a.num_micro_batches == b.num_micro_batches
    assert a.step == b.step
    assert [r.indices for r in a.ranks] == [r.indices for r in b.ranks]
    assert [r.cost for r in a.ranks] == [r.cost for r in b.ranks]


@pytest.mark.parametrize("align_to", [1, 16])
def test_forest_is_balanced_under_the_weights_of_its_rollouts(align_to):
    forest = grpo(3, 12)
    cap = 16384
    kwargs = dict(align_to=align_to, sync="micro_batch", overlong="isolate", progress=False)
    modelled = planner.balance(forest, 4, cap, model_config=LLAMA_8B, **kwargs)
    # The batch: the rollouts flat, each aligned; the longest: an aligned rollout plus the
    # pieces' padding slack, below the largest tree (a GRPO tree: its prompt and completions).
    rollouts = round_up(forest.rollout_len, align_to)
    roots = np.flatnonzero(forest.node_parent == -1)
    tree_tokens = [
        int(forest.node_len[r] + forest.node_len[forest.node_parent == r].sum()) for r in roots
    ]
    trees = max(round_up(t, align_to) for t in tree_tokens)
    longest = min(trees, int(rollouts.max()) + 2 * (align_to - 1))
    linear, quadratic, micro = model_cost(LLAMA_8B, int(rollouts.sum()), longest)
    by_hand = planner.balance(
        forest,
        4,
        cap,
        cost="attention",
        attention_cost=(linear, quadratic),
        micro_batch_cost=micro,
        **kwargs,
    )
    same_balance(modelled, by_hand)
    assert modelled.step.micro_batch_sync_cost > 0
    seen = []
    for rank in modelled.ranks:
        assert rank.plan.num_micro_batches == modelled.num_micro_batches
        for mb in rank.plan.micro_batches:
            assert mb.meta.cu_seqlens_aligned[-1] <= cap
            seen.extend(mb.rollouts.tolist())
    assert sorted(seen) == list(range(forest.num_rollouts))


def test_chains_balance_as_their_lengths():
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 6000, 40).tolist()
    for sync in ("step", "micro_batch"):
        kwargs = dict(align_to=8, sync=sync, model_config=LLAMA_8B, progress=False)
        flat = planner.balance(lengths, 3, 8192, **kwargs)
        tree = planner.balance(chains(lengths), 3, 8192, **kwargs)
        same_balance(flat, tree)


def test_group_ids_of_the_wrong_size_are_named_with_a_forest():
    with pytest.raises(ValueError, match="group_ids has 15 entries for 16 rollouts") as e:
        planner.balance(grpo(5, 2), 2, 8192, group_ids=[0] * 15, model_config=LLAMA_8B)
    assert "model_config" not in str(e.value)
    with pytest.raises(ValueError, match="num_hidden_layers is missing"):
        planner.balance(grpo(5, 2), 2, 8192, model_config={"hidden_size": 8})


def test_a_sidecar_costs_a_forest_as_the_in_process_planner(tmp_path):
    forest = grpo(6, 10)
    with Sidecar(tmp_path) as sidecar, SchedulerClient(sidecar.target, timeout=20) as client:
        remote = client.balance_batch(
            forest, 3, 8192, sync="micro_batch", align_to=8, model_config=LLAMA_8B
        )
        local = planner.balance(
            forest,
            3,
            8192,
            sync="micro_batch",
            align_to=8,
            model_config=LLAMA_8B,
            progress=False,
        )
        assert remote.num_micro_batches == local.num_micro_batches
        assert remote.step == local.step
        assert [r.indices for r in remote.ranks] == [r.indices for r in local.ranks]
        assert [r.cost for r in remote.ranks] == [r.cost for r in local.ranks]
        with pytest.raises(SchedulerError) as e:
            client.balance_batch(forest, 3, 8192, group_ids=[0] * 79, model_config=LLAMA_8B)
        assert e.value.code == "INVALID_ARGUMENT"
        assert "group_ids has 79 entries for 80 rollouts" in e.value.message
