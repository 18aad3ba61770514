"""packsched.planner.balance(sync=...), its step stats and model_config, through the
binding: shapes and guarantees checked from the lengths, costs recomputed here."""

import json
import math
import random

import pytest

from packsched import planner
from packsched.model_cost import model_cost

ALPHA = 2048 * 24576


def long_context(n, cap, seed):
    rng = random.Random(seed)
    return [int(min(max(rng.lognormvariate(9.0, 1.2), 64), cap)) for _ in range(n)]


def cost(length):
    return 24576 * length + length * length


def steps(batch, lengths, alpha):
    k = batch.num_micro_batches
    cells = [
        [
            (alpha + sum(cost(lengths[r.indices[j]]) for j in mb)) if mb else 0
            for mb in r.plan.micro_batches
        ]
        for r in batch.ranks
    ]
    assert all(len(c) == k for c in cells)
    return max(sum(c) for c in cells), sum(max(c[i] for c in cells) for i in range(k))


@pytest.mark.parametrize("sync", ["step", "micro_batch"])
@pytest.mark.parametrize("seed", range(4))
def test_shape_cap_and_stats(sync, seed):
    cap, world = 65536, 8
    lengths = long_context(128, cap, seed)
    batch = planner.balance(
        lengths,
        world,
        cap,
        cost="attention",
        sync=sync,
        micro_batch_cost=ALPHA,
        divisible_by=2,
    )
    assert len(batch.ranks) == world
    assert batch.num_micro_batches % 2 == 0
    seen = sorted(i for r in batch.ranks for i in r.indices)
    assert seen == list(range(len(lengths)))
    for r in batch.ranks:
        assert len(r.plan.micro_batches) == batch.num_micro_batches
        for mb in r.plan.micro_batches:
            assert sum(lengths[r.indices[j]] for j in mb) <= cap
    step_sync, slot_sync = steps(batch, lengths, ALPHA)
    assert batch.step.step_sync_cost == step_sync
    assert batch.step.micro_batch_sync_cost == slot_sync
    k_min = math.ceil(sum(lengths) / (world * cap))
    ideal = (sum(cost(x) for x in lengths) + ALPHA * k_min * world) / world
    assert batch.step.ideal == pytest.approx(ideal)
    actual = step_sync if sync == "step" else slot_sync
    assert batch.step.efficiency == pytest.approx(ideal / actual)
    assert batch.step.lower_bound <= min(step_sync, slot_sync)


def test_micro_batch_sync_balances_slots_better():
    cap = 131072
    better = 0
    for seed in range(5):
        lengths = long_context(256, cap, seed)
        kw = dict(cost="attention", micro_batch_cost=ALPHA)
        step = planner.balance(lengths, 8, cap, sync="step", **kw)
        slot = planner.balance(lengths, 8, cap, sync="micro_batch", **kw)
        better += slot.step.micro_batch_sync_cost < step.step.micro_batch_sync_cost
    assert better == 5


def test_groups_stay_on_one_rank():
    lengths = long_context(96, 32768, 3)
    groups = [i // 6 for i in range(len(lengths))]
    batch = planner.balance(lengths, 4, 32768, group_ids=groups, sync="micro_batch")
    rank_of = {}
    for r, rank in enumerate(batch.ranks):
        for i in rank.indices:
            assert rank_of.setdefault(groups[i], r) == r


def test_bad_sync_and_cost():
    with pytest.raises(ValueError, match="sync"):
        planner.balance([10, 20], 2, 100, sync="slot")
    with pytest.raises(ValueError, match="micro_batch_cost"):
        planner.balance([10, 20], 2, 100, micro_batch_cost=-1)


def test_model_config(tmp_path):
    config = {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "vocab_size": 32000,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    linear, quadratic, micro = model_cost(path, 10**6, 65536)
    assert (linear, quadratic, micro) == model_cost(config, 10**6, 65536)
    # 6 x parameters per token against 3 x layers x heads x 2 x head dim per token pair.
    params = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 4096 * 32000
    assert linear / quadratic == pytest.approx(6 * params / (3 * 32 * 32 * 256), rel=1e-3)
    assert micro == 2048 * linear
    lengths = long_context(64, 65536, 1)
    batch = planner.balance(lengths, 4, 65536, sync="micro_batch", model_config=path)
    assert batch.step.micro_batch_sync_cost > 0
    with pytest.raises(ValueError, match="num_hidden_layers is missing"):
        model_cost({"hidden_size": 8}, 10, 10)
