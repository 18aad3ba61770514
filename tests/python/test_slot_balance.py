"""packsched.planner.balance(sync=...), its step stats and model_config, through the
binding: shapes and guarantees checked from the lengths, costs recomputed here."""

import json
import math
import random

import pytest

from packsched import planner
from packsched.model_cost import model_cost

from model_configs import LLAMA_8B

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


def linear_per_quadratic(config):
    linear, quadratic, _ = model_cost(config, 10**6, 65536)
    return linear / quadratic


def test_model_config_whole_reals_are_integers():
    as_reals = dict(LLAMA_8B, hidden_size=4096.0, num_key_value_heads=8.0)
    assert model_cost(as_reals, 10**6, 65536) == model_cost(LLAMA_8B, 10**6, 65536)
    # 8 KV heads (GQA) cost less than 32 (MHA) per token, against the same scores: 8.0 is not
    # dropped.
    mha = dict(LLAMA_8B, num_key_value_heads=32)
    assert linear_per_quadratic(as_reals) < linear_per_quadratic(mha)
    lengths = long_context(32, 65536, 3)
    kwargs = dict(sync="micro_batch")
    reals = planner.balance(lengths, 4, 65536, model_config=as_reals, **kwargs)
    ints = planner.balance(lengths, 4, 65536, model_config=LLAMA_8B, **kwargs)
    assert reals.step == ints.step


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_key_value_heads", 7.5, "num_key_value_heads = 7.5"),
        ("hidden_size", 4096.5, "hidden_size = 4096.5"),
        ("num_hidden_layers", 2**70, "num_hidden_layers"),
        ("num_key_value_heads", 64, "num_key_value_heads = 64"),
        ("num_experts_per_tok", 8, "num_experts_per_tok = 8"),
        ("first_k_dense_replace", 40, "first_k_dense_replace = 40"),
        ("mlp_only_layers", [0, 32], "mlp_only_layers"),
    ],
)
def test_model_config_refusals_name_the_field(field, value, message):
    config = dict(LLAMA_8B, **{field: value})
    with pytest.raises(ValueError, match=message):
        model_cost(config, 10**6, 65536)
    with pytest.raises(ValueError, match=message):
        planner.balance([100, 200], 2, 65536, model_config=config)


def test_model_config_text_config_and_alternating_layers():
    vlm = {"model_type": "llava", "hidden_size": 1024, "text_config": dict(LLAMA_8B)}
    assert model_cost(vlm, 10**6, 65536) == model_cost(LLAMA_8B, 10**6, 65536)
    # A Qwen-MoE-like model whose MoE layers are every second one (decoder_sparse_step = 2),
    # or all but a list (mlp_only_layers), costs between the dense and the all-MoE model.
    moe = dict(LLAMA_8B, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=14336)
    # (The same attention in all: linear over quadratic compares their per-token costs.)
    every = linear_per_quadratic(moe)
    dense = linear_per_quadratic(LLAMA_8B)
    half = linear_per_quadratic(dict(moe, decoder_sparse_step=2))
    assert dense < half < every
    assert half == pytest.approx((dense + every) / 2, rel=1e-3)
    listed = linear_per_quadratic(dict(moe, mlp_only_layers=list(range(1, 32, 2))))
    assert listed == pytest.approx(half, rel=1e-6)


def row_greedy_step(lengths, world, cap, alpha):
    """Slot rows filled one after the other, longest first, each sequence to the row's cheapest
    micro-batch that stays within the cap (a new row when none does): the micro-batch-sync step."""
    rows = []
    for length in sorted(lengths, reverse=True):
        row = rows[-1] if rows else None
        fits = [r for r in range(world) if row and row[r][1] + length <= cap]
        if not fits:
            row = [[0, 0] for _ in range(world)]  # [cost, tokens] of each micro-batch
            rows.append(row)
            fits = list(range(world))
        r = min(fits, key=lambda r: (row[r][0], r))
        row[r][0] += cost(length) + (alpha if row[r][1] == 0 else 0)
        row[r][1] += length
    return sum(max(c for c, _ in row) for row in rows)


def test_micro_batch_sync_is_never_behind_the_row_greedy():
    # Heavy-tailed (Pareto) lengths: filling slot rows one after the other sometimes beats
    # placing each sequence in the best slot; the planner keeps the better construction.
    alpha = 2048 * 24576
    for shape in (1.1, 1.5, 2.5):
        for per_rank in (64, 128):
            for seed in range(5):
                rng = random.Random(seed * 7919 + per_rank)
                lengths = [
                    int(min(131072, 1024 * rng.paretovariate(shape))) for _ in range(8 * per_rank)
                ]
                batch = planner.balance(
                    lengths,
                    8,
                    131072,
                    cost="attention",
                    attention_cost=(24576, 1),
                    micro_batch_cost=alpha,
                    sync="micro_batch",
                )
                ours = steps(batch, lengths, alpha)[1]
                assert ours <= row_greedy_step(lengths, 8, 131072, alpha), (shape, per_rank, seed)
