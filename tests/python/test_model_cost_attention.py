"""The cost from the model with sliding-window, chunked and shared-expert layers, from Python.

The configs are published config.json contents typed in (JSON's null, true, false and lists of
layer types included); the expected figures are counted here by hand: matrices per token (x 6)
and, per layer, the keys each query sees, position by position.
"""

import json

import pytest

from packsched import planner
from packsched.model_cost import model_cost

LLAMA4_SCOUT = {
    "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text",
        "hidden_size": 5120,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 48,
        "num_local_experts": 16,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 1,
        "vocab_size": 202048,
        "attention_chunk_size": 8192,
        "no_rope_layers": [],
        "moe_layers": None,
        "use_qk_norm": True,
        "rope_theta": 500000.0,
    },
}

GPT_OSS_20B = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_hidden_layers": 24,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "vocab_size": 201088,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "tie_word_embeddings": False,
}

QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 48,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 48,
}


def scores(length, keys):
    """sum over positions of (2 x keys seen - 1): L^2 for a causal sequence."""
    return sum(2 * keys(p) - 1 for p in range(length))


def scout_flops(length):
    h = 5120
    attention = 2 * h * 40 * 128 + 2 * h * 8 * 128
    experts = 3 * h * 8192 + 3 * h * 8192 + h * 16  # routed, shared, router
    params = 48 * (attention + experts) + h * 202048
    per_score = 3 * 40 * 256
    full = scores(length, lambda p: p + 1)
    chunked = scores(length, lambda p: p % 8192 + 1)
    return 6 * params * length + per_score * (12 * full + 36 * chunked)


def test_llama4_scout_chunks_and_shared_expert():
    cost = model_cost(LLAMA4_SCOUT, 10**6, 131072)
    unit = 2**cost.shift
    h = 5120
    params = 48 * (2 * h * 40 * 128 + 2 * h * 8 * 128 + 6 * h * 8192 + h * 16) + h * 202048
    assert cost.linear * unit == pytest.approx(6 * params, abs=unit)
    assert (cost.chunked, cost.chunk) != (0, 0) and cost.chunk == 8192
    assert cost.windowed == 0
    by_hand = scout_flops(131072) / scout_flops(1024)
    assert by_hand == pytest.approx(201, abs=1)
    assert cost.sequence_cost(131072) / cost.sequence_cost(1024) == pytest.approx(by_hand, rel=1e-6)


def test_gpt_oss_sliding_layers_in_a_balanced_plan(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT_OSS_20B))
    cost = model_cost(path, 10**6, 65536)
    assert cost == model_cost(GPT_OSS_20B, 10**6, 65536)
    unit = 2**cost.shift
    h = 2880
    params = 24 * (2 * h * 64 * 64 + 2 * h * 8 * 64 + 3 * h * 2880 * 4 + h * 32) + h * 201088
    assert cost.linear * unit == pytest.approx(6 * params, abs=unit)
    assert cost.quadratic * unit == pytest.approx(12 * 3 * 64 * 128, abs=unit)
    assert cost.windowed * unit == pytest.approx(12 * 3 * 64 * 128, abs=unit)
    assert cost.window == 128
    for length in (1, 127, 128, 129, 5000):
        sliding = scores(length, lambda p: min(p + 1, 128))
        expected = cost.linear * length + cost.quadratic * length**2 + cost.windowed * sliding
        assert cost.sequence_cost(length) == expected
    # Every micro-batch of a balanced plan costs its sequences' sequence_cost (the weights scaled
    # for this batch, as balance scales them).
    lengths = [5000, 300, 129, 7000, 65536, 40000, 1200, 128, 900, 33333]
    cost = model_cost(path, sum(lengths), max(lengths))
    batch = planner.balance(lengths, 2, 65536, sync="micro_batch", model_config=path)
    for rank in batch.ranks:
        for indices, meta in zip(rank.plan.micro_batches, rank.plan.metadata):
            want = sum(cost.sequence_cost(lengths[rank.indices[i]]) for i in indices)
            assert meta.cost == want


def test_qwen3_moe_windows_only_with_use_sliding_window():
    cost = model_cost(QWEN3_MOE, 10**6, 65536)
    assert (cost.windowed, cost.window) == (0, 0)
    h = 2048
    params = 48 * (2 * h * 32 * 128 + 2 * h * 4 * 128 + 3 * h * 768 * 8 + h * 128) + h * 151936
    assert cost.linear * 2**cost.shift == pytest.approx(6 * params, abs=2**cost.shift)
    sliding = dict(QWEN3_MOE, use_sliding_window=True, sliding_window=4096)
    windowed = model_cost(sliding, 10**6, 65536)
    assert windowed.quadratic == 0 and windowed.window == 4096
    assert windowed.windowed == cost.quadratic


def test_bad_layer_types_name_the_field():
    with pytest.raises(ValueError, match="layer_types"):
        model_cost(dict(GPT_OSS_20B, layer_types=["sliding_attention"] * 3), 10**6, 65536)
    with pytest.raises(ValueError, match="use_sliding_window"):
        model_cost(dict(QWEN3_MOE, use_sliding_window="yes"), 10**6, 65536)
