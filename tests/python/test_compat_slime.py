"""packsched.compat.slime: a global batch to per-rank micro-batches on the coordinator mode."""

import math
import random

import pytest

from packsched.compat import slime


def ffd_bins(lengths, cap):
    """First-fit decreasing bin count (reference, written here)."""
    bins = []
    for length in sorted(lengths, reverse=True):
        for i, used in enumerate(bins):
            if used + length <= cap:
                bins[i] += length
                break
        else:
            bins.append(length)
    return len(bins)


def first_fit_bins(lengths, cap):
    """slime's count: first fit in input order."""
    bins = []
    for length in lengths:
        for i, used in enumerate(bins):
            if used + length <= cap:
                bins[i] += length
                break
        else:
            bins.append(length)
    return len(bins)


def long_context(seed, n, cap):
    rng = random.Random(seed)
    return [int(min(cap, max(64, rng.lognormvariate(9.0, 1.2)))) for _ in range(n)]


def cost(length):
    return 24576 * length + length * length


def slot_step(lengths, plan):
    """Σ over slots of the costliest micro-batch of that slot (ranks meet at every one)."""
    k = len(plan[0])
    return sum(max(sum(cost(lengths[i]) for i in ranks[s]) for ranks in plan) for s in range(k))


@pytest.mark.parametrize("seed, world, divisible", [(0, 4, 1), (1, 8, 2), (2, 3, 1)])
def test_shape_cap_coverage_and_count(seed, world, divisible):
    cap = 32768
    lengths = long_context(seed, 96, cap)
    plan = slime.split_global_batch(lengths, world, cap, num_micro_batches_divisible_by=divisible)
    assert len(plan) == world
    k = len(plan[0])
    assert all(len(rank) == k for rank in plan) and k % divisible == 0
    seen = sorted(i for rank in plan for mb in rank for i in mb)
    assert seen == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in mb) <= cap for rank in plan for mb in rank)
    bound = math.ceil(math.ceil(ffd_bins(lengths, cap) / world) / divisible) * divisible
    assert k <= bound


def test_cp_size_multiplies_the_cap():
    lengths = [3000] * 16
    plan = slime.split_global_batch(lengths, 2, 4096, cp_size=2)
    assert all(sum(lengths[i] for i in mb) <= 8192 for rank in plan for mb in rank)
    assert max(len(mb) for rank in plan for mb in rank) == 2  # two fit 8192, one 4096 alone


def test_groups_stay_on_one_rank():
    rng = random.Random(5)
    lengths = [rng.randint(100, 6000) for _ in range(64)]
    groups = [i // 8 for i in range(64)]
    plan = slime.split_global_batch(lengths, 4, 16384, group_ids=groups)
    for g in range(8):
        holders = {r for r, rank in enumerate(plan) for mb in rank for i in mb if groups[i] == g}
        assert len(holders) == 1


def test_micro_batch_sync_shortens_the_slot_step_against_step_sync():
    cap = 65536
    lengths = long_context(11, 256, cap)
    micro = slime.split_global_batch(lengths, 8, cap)
    step = slime.split_global_batch(lengths, 8, cap, sync="step")
    assert slot_step(lengths, micro) < slot_step(lengths, step)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # slime removed the function
def test_minimum_count_is_never_above_first_fit():
    for seed in range(5):
        lengths = long_context(seed, 200, 32768)
        assert slime.get_minimum_num_micro_batch_size(lengths, 32768) <= first_fit_bins(
            lengths, 32768
        )
    with pytest.raises(ValueError):
        slime.get_minimum_num_micro_batch_size([5000], 4096)
