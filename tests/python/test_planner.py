"""packsched.planner: the in-process planner keeps the planner's guarantees through the binding."""

import math
import random

import numpy as np
import pytest
import torch

from packsched import planner


def rl_lengths(n, seed):
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.lognormal(math.log(600), 0.6, n), 200, 2000).astype(np.int64)
    response = np.clip(rng.lognormal(math.log(1500), 1.0, n), 50, 16000).astype(np.int64)
    return (prompt + response).tolist()


def check_plan(plan, lengths, cap):
    kept = [i for i in range(len(lengths)) if plan.revert[i] >= 0]
    assert sorted(plan.reorder) == kept
    assert [i for mb in plan.micro_batches for i in mb] == plan.reorder
    for position, index in enumerate(plan.reorder):
        assert plan.revert[index] == position
    assert sorted(plan.dropped) == [i for i in range(len(lengths)) if plan.revert[i] < 0]
    for mb, meta in zip(plan.micro_batches, plan.metadata):
        assert mb == sorted(mb)
        assert meta.tokens == sum(lengths[i] for i in mb)
        assert (
            meta.cu_seqlens == np.concatenate([[0], np.cumsum([lengths[i] for i in mb])]).tolist()
        )
        assert meta.max_seqlen == max((lengths[i] for i in mb), default=0)
        assert meta.empty == (not mb)
        if cap is not None and not meta.overlong:
            assert meta.total <= cap
    assert plan.num_micro_batches == len(plan.micro_batches) == len(plan.empty)


@pytest.mark.parametrize("seed", range(20))
def test_plan_local_keeps_every_guarantee(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 7, 64, 300])
    lengths = rl_lengths(n, seed)
    cap = max(lengths) + rng.choice([0, 1000, 20000])
    plan = planner.plan_local(lengths, cap)
    check_plan(plan, lengths, cap)
    assert plan.num_micro_batches >= math.ceil(sum(lengths) / cap)
    assert plan.stats.over_cap_parts == 0


def test_inputs_may_be_lists_numpy_or_torch_and_give_the_same_plan():
    lengths = rl_lengths(100, 3)
    plans = [
        planner.plan_local(x, 20480)
        for x in (lengths, np.array(lengths, dtype=np.int32), torch.tensor(lengths))
    ]
    assert plans[0] == plans[1] == plans[2]


def test_local_bound_then_partition_is_plan_local():
    lengths = rl_lengths(500, 11)
    bound = planner.local_bound(lengths, 20480)
    assert bound.k == planner.plan_local(lengths, 20480).num_micro_batches
    assert bound.lower_bound_k == math.ceil(sum(lengths) / 20480)
    assert planner.partition(lengths, bound.k, 20480) == planner.plan_local(lengths, 20480)


def test_a_larger_agreed_k_stays_within_the_cap_and_balances_no_worse():
    lengths = rl_lengths(400, 5)
    k = planner.local_bound(lengths, 20000).k
    base = planner.partition(lengths, k, 20000)
    for extra in (1, 5, 50):
        plan = planner.partition(lengths, k + extra, 20000)
        check_plan(plan, lengths, 20000)
        assert plan.num_micro_batches == k + extra
        assert plan.stats.max_part_cost <= base.stats.max_part_cost


def test_fewer_sequences_than_k_gives_flagged_empty_micro_batches():
    plan = planner.partition([5, 7], 4, 100)
    assert plan.empty.count(True) == 2
    assert all(meta.total == 0 and meta.cu_seqlens == [0] for meta in plan.metadata if meta.empty)


def test_dropped_sequences_are_reported_and_count_nowhere():
    plan = planner.plan_local([30, 150, 40], 100, overlong="drop", loss_tokens=[3, 100, 5])
    assert plan.dropped == [1] and plan.revert[1] == -1
    assert plan.loss_weights[1] == 0.0
    assert plan.global_counts == (8, 2)


def test_invalid_input_raises_value_error_naming_the_value():
    with pytest.raises(ValueError, match=r"lengths\[1\] = -2"):
        planner.plan_local([1, -2], 10)
    with pytest.raises(ValueError, match="cap_mode 'wide'"):
        planner.plan_local([1, 2], 10, cap_mode="wide")
    with pytest.raises(ValueError, match="max_token_len"):
        planner.plan_local([1, 2], 0)
    with pytest.raises(ValueError, match="1500"):
        planner.plan_local([1500, 2], 1000)  # overlong under the default "reject"
    with pytest.raises(TypeError, match="max_tokens"):
        planner.plan_local([1, 2], 10, max_tokens=5)
    with pytest.raises(TypeError, match="must be an integer, not float"):
        planner.plan_local([1.5, 2.0], 10)
    with pytest.raises(ValueError, match="one-dimensional"):
        planner.plan_local([[1, 2]], 10)
    with pytest.raises(ValueError, match="loss_tokens has 1 entries"):
        planner.plan_local([1, 2], 10, loss_tokens=[1])


@pytest.mark.parametrize(
    "call",
    [
        lambda: planner.local_bound([1, 2], None),
        lambda: planner.plan_local([1, 2], None),
        lambda: planner.balance([1, 2], 2, None),
    ],
)
def test_a_missing_cap_is_reported_as_required(call):
    with pytest.raises(ValueError, match="max_token_len is required") as e:
        call()
    assert "= 0" not in str(e.value)  # None is not the value 0 the planner would report


def test_numpy_integer_options_are_accepted():
    plan = planner.partition(
        [5, 3, 4], np.int64(2), np.int64(10), min_micro_batches=np.int32(2), align_to=np.int64(2)
    )
    assert plan.num_micro_batches == 2 and plan.stats.cap == 10


def test_fixed_k_needs_no_cap_and_equal_size_splits_counts_evenly():
    lengths = rl_lengths(60, 2)
    plan = planner.partition(lengths, 6, equal_size=True)
    assert [len(mb) for mb in plan.micro_batches] == [10] * 6
    with pytest.raises(ValueError):
        planner.partition(lengths, 7, equal_size=True)


def test_balance_gives_equal_counts_and_keeps_groups_together():
    lengths = rl_lengths(103, 8)
    groups = [i // 4 for i in range(103)]
    balanced = planner.balance(lengths, 4, 20480, group_ids=groups)
    seen = sorted(i for rank in balanced.ranks for i in rank.indices)
    assert seen == list(range(103))
    for rank in balanced.ranks:
        assert {groups[i] for i in rank.indices}.isdisjoint(
            {groups[i] for other in balanced.ranks if other is not rank for i in other.indices}
        )
        assert rank.plan.num_micro_batches == balanced.num_micro_batches
        check_plan(rank.plan, [lengths[i] for i in rank.indices], 20480)
    plain = planner.balance(lengths, 4, 20480)
    assert max(len(r.indices) for r in plain.ranks) - min(len(r.indices) for r in plain.ranks) <= 1


def test_plans_are_deterministic():
    lengths = rl_lengths(2000, 9)
    assert planner.plan_local(lengths, 20480) == planner.plan_local(lengths, 20480)


def test_fast_metadata_equals_the_dataclass_and_checks_its_fields():
    import dataclasses

    from packsched.plan import MicroBatchMeta, meta_of

    plan = planner.plan_local([5, 9, 300, 17, 3000, 40], 4000, loss_tokens=[1, 2, 3, 4, 5, 6])
    for meta in plan.metadata:
        values = dataclasses.asdict(meta)
        made = meta_of(values)
        assert made == MicroBatchMeta(**values) and type(made) is MicroBatchMeta
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.total = 1
    with pytest.raises(KeyError, match="no value for total"):
        meta_of({k: v for k, v in values.items() if k != "total"})
    with pytest.raises(TypeError, match="no field bogus"):
        meta_of({**values, "bogus": 1})
