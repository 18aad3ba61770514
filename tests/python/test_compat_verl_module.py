"""The rest of verl's seqlen_balancing module in packsched.compat.verl: partitions, metrics and
arithmetic helpers, checked against references computed here."""

import itertools
import random

import numpy as np
import pytest
import torch

from packsched.compat import verl


def brute_force_best_max(values, k, equal_size=False):
    """The smallest possible largest part sum over every assignment of values to k parts."""
    best = None
    for assignment in itertools.product(range(k), repeat=len(values)):
        if equal_size and any(assignment.count(p) != len(values) // k for p in range(k)):
            continue
        sums = [0] * k
        for value, part in zip(values, assignment):
            sums[part] += value
        best = max(sums) if best is None else min(best, max(sums))
    return best


def check_partition(parts, n, k, equal_size):
    assert len(parts) == k
    assert sorted(i for part in parts for i in part) == list(range(n))
    if equal_size:
        assert [len(part) for part in parts] == [n // k] * k


@pytest.mark.parametrize("function", [verl.karmarkar_karp, verl.greedy_partition])
def test_partitions_are_complete_and_near_the_optimum(function):
    rng = random.Random(7)
    for _ in range(40):
        k = rng.randint(1, 3)
        n = rng.choice([m for m in range(k, 8) if m % k == 0])
        values = [rng.randint(0, 1000) for _ in range(n)]
        equal_size = rng.random() < 0.5
        parts = function(values, k, equal_size)
        check_partition(parts, n, k, equal_size)
        largest = max(sum(values[i] for i in part) for part in parts)
        # Both heuristics stay within 4/3 of the optimum plus one item (LPT's bound; KK's is
        # no worse); equal_size adds at most one item more per part.
        optimum = brute_force_best_max(values, k, equal_size)
        assert largest <= optimum * 4 / 3 + max(values) * (1 if equal_size else 0) + 1


def test_workloads_beyond_the_planners_range_and_zeros_are_partitioned():
    lengths = [131072, 65536, 65536, 0, 3, 200000]
    workloads = verl.calculate_workload(lengths)
    assert max(workloads) > 2**31  # beyond one planner length
    parts = verl.get_seqlen_balanced_partitions(workloads, 2, equal_size=False)
    check_partition(parts, len(lengths), 2, False)
    assert all(part == sorted(part) and part for part in parts)
    sums = sorted(sum(workloads[i] for i in part) for part in parts)
    # The 200000-token sequence alone outweighs all the others: it must sit alone.
    assert [5] in parts and sums[0] == sum(workloads) - workloads[5]


def test_get_seqlen_balanced_partitions_refuses_more_parts_than_items():
    with pytest.raises(ValueError, match="exceeds the 2 items"):
        verl.get_seqlen_balanced_partitions([5, 6], 3, equal_size=False)


def test_calculate_workload_matches_verls_formula_in_every_container():
    lengths = [1, 100, 65536]
    expected = [24576 * n + n * n for n in lengths]
    as_tensor = verl.calculate_workload(torch.tensor(lengths, dtype=torch.int32))
    assert as_tensor.dtype == torch.int64 and as_tensor.tolist() == expected
    assert verl.calculate_workload(np.array(lengths, dtype=np.int32)).tolist() == expected
    assert verl.calculate_workload(lengths) == expected
    assert verl.calculate_workload(7) == 24576 * 7 + 49


def test_ceildiv_and_roundup_divisible():
    for a in range(-7, 20):
        for b in range(1, 6):
            assert verl.ceildiv(a, b) == -((-a) // b) == int(np.ceil(a / b))
            rounded = verl.roundup_divisible(a, b)
            assert rounded % b == 0 and rounded >= a and rounded - b < a


def test_log_seqlen_unbalance_reports_chunks_and_partitions():
    seqlens = [10, 20, 30, 40, 50, 60]
    partitions = [[0, 5], [1, 4], [2, 3]]
    metrics = verl.log_seqlen_unbalance(seqlens, partitions, prefix="x")
    # Chunks of 6 // 3 = 2 in input order: 30, 70, 110; partitions: 70 each; mean 210 / 3.
    assert metrics == {
        "x/min": 30,
        "x/max": 110,
        "x/minmax_diff": 80,
        "x/balanced_min": 70,
        "x/balanced_max": 70,
        "x/mean": 70.0,
    }


def test_group_partitions_balance_whole_groups():
    rng = random.Random(3)
    uids = [g for g in range(8) for _ in range(rng.randint(1, 4))]
    seqlens = [rng.randint(10, 4000) for _ in uids]
    parts = verl.get_group_balanced_partitions(seqlens, uids, 4)
    assert sorted(i for part in parts for i in part) == list(range(len(uids)))
    owner = {}
    for p, part in enumerate(parts):
        assert part == sorted(part)
        for i in part:
            assert owner.setdefault(uids[i], p) == p
    assert [len({uids[i] for i in part}) for part in parts] == [2, 2, 2, 2]  # equal group counts
    with pytest.raises(ValueError, match="3 uid groups"):
        verl.get_group_balanced_partitions([1, 2, 3], ["a", "b", "c"], 4)


def test_force_group_size_keeps_consecutive_rows_together_within_the_cap():
    rng = random.Random(9)
    lengths = [rng.randint(50, 900) for _ in range(24)]
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.int64)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    batch = {"attention_mask": mask, "ids": torch.arange(len(lengths))}
    micro_batches, idx = verl.rearrange_micro_batches(batch, 2048, force_group_size=3)
    assert sorted(i for part in idx for i in part) == list(range(24))
    for mb, part in zip(micro_batches, idx):
        assert mb["ids"].tolist() == part
        groups = {i // 3 for i in part}
        assert sorted(part) == sorted(3 * g + j for g in groups for j in range(3))  # whole groups
        # Within the cap, unless it is one group that alone is over it (run alone, isolated).
        group_tokens = sum(lengths[i] for i in part)
        assert int(mb["attention_mask"].sum()) == group_tokens
        assert group_tokens <= 2048 or len(groups) == 1
    with pytest.raises(ValueError, match="force_group_size = 5"):
        verl.rearrange_micro_batches(batch, 2048, force_group_size=5)
