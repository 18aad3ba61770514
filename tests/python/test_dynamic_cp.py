"""packsched.dynamic_cp: the in-process dynamic context-parallel plan, read per rank, sharded by
the kernels' head-tail layer at each group's size."""

import random

import numpy as np
import pytest

from model_configs import LLAMA_8B
from packsched import kernels
from packsched.dynamic_cp import dynamic_cp

CAP = 4096


def mix(seed, n=60, longest=6 * CAP):
    rng = random.Random(seed)
    return [min(int(256 * (1 - rng.random()) ** -1.1), longest) for _ in range(n)]


@pytest.mark.parametrize("sizes,ranks", [("powers_of_two", 8), ("divisors", 12), ("any", 6)])
def test_every_rank_reads_its_groups_and_every_sequence_runs_once(sizes, ranks):
    lengths = mix(ranks)
    max_cp = {8: 8, 12: 12, 6: 6}[ranks]
    plan = dynamic_cp(
        lengths,
        ranks,
        CAP,
        sizes=sizes,
        max_cp=max_cp,
        model_config=LLAMA_8B,
        loss_tokens=[n - 1 for n in lengths],
        divisible_by=2,
    )
    assert plan.num_micro_batches % 2 == 0
    per_rank = [plan.for_rank(r) for r in range(ranks)]
    runs = [0] * len(lengths)
    names = {}
    for slot in range(plan.num_micro_batches):
        seen_groups = set()
        for r in range(ranks):
            mb = per_rank[r][slot]
            assert mb.slot == slot and mb.group[mb.cp_rank] == r
            assert names.setdefault(mb.group_name, mb.group) == mb.group
            if mb.group in seen_groups:
                continue
            seen_groups.add(mb.group)
            c = mb.cp
            cu = mb.cu_seqlens
            assert cu[-1] // c <= CAP
            for b, s in enumerate(mb.sequences):
                runs[s] += 1
                assert (cu[b + 1] - cu[b]) % (2 * c) == 0 and cu[b + 1] - cu[b] >= lengths[s]
        assert sum(len(g) for g in seen_groups) == ranks
    assert runs == [1] * len(lengths)
    weights = plan.loss_weights
    assert sum(w * (n - 1) for w, n in zip(weights, lengths)) == pytest.approx(1.0)


def test_each_group_shards_and_unshards_its_micro_batch_exactly():
    lengths = mix(3, n=40)
    plan = dynamic_cp(lengths, 6, CAP, sizes="any", model_config=LLAMA_8B)
    sizes_used = set()
    for slot in plan.slots:
        for g in slot["groups"]:
            if not g["sequences"]:
                continue
            c, cu = g["size"], np.asarray(g["cu_seqlens"], dtype=np.int32)
            sizes_used.add(c)
            x = np.arange(cu[-1] * 2, dtype=np.int64).reshape(cu[-1], 2)
            shards = [kernels.cp_shard(x, cu, c, r) for r in range(c)]
            assert all(s.shape[0] == cu[-1] // c <= CAP for s in shards)
            assert np.array_equal(kernels.cp_unshard(shards, cu, c), x)
    assert len(sizes_used) >= 2  # the step mixes group sizes


def test_bad_input_names_the_sequence_or_option():
    with pytest.raises(ValueError, match="sequence 1 \\(length 40000\\)"):
        dynamic_cp([10, 40000], 8, CAP)
    with pytest.raises(ValueError, match="max_cp = 3: must divide ranks = 8"):
        dynamic_cp([10], 8, CAP, max_cp=3, model_config=LLAMA_8B)
    with pytest.raises(ValueError, match="cannot split ranks = 6"):
        dynamic_cp([10], 6, CAP, min_cp=4)
    with pytest.raises(ValueError, match="sizes must be one of"):
        dynamic_cp([10], 6, CAP, sizes="odd")
    # A tiny request for a huge plan (10^9 groups: 2^20 ranks in groups of one, 1000 slots) is
    # refused before anything is allocated.
    with pytest.raises(ValueError, match="divisible_by = 1000: times world_size / max_cp"):
        dynamic_cp([10], 1 << 20, 1000, max_cp=1, divisible_by=1000)
