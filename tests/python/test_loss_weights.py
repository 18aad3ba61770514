"""Loss weights: packing, micro-batching and data parallelism change the speed, never the loss.

W simulated ranks each plan their share with the in-process planner (local bound, MAX of k, SUM
of the loss counts, partition with the agreed k): the weighted sum over every rank's micro-batches
equals the loss computed directly on the whole unpacked batch, for every mode and reduction.
"""

import math

import numpy as np
import pytest

from packsched import planner

MODES = ["token_mean", "sample_mean", "seq_sum", "sum", "sum_norm"]
C = 4096.0


def direct_loss(token_losses, masks, mode):
    """The objective on the whole batch, from its definition (docs/design.md §2)."""
    sums = [float(np.sum(loss * m)) for loss, m in zip(token_losses, masks)]
    counts = [int(m.sum()) for m in masks]
    with_loss = [i for i, c in enumerate(counts) if c > 0]
    if mode == "token_mean":
        return sum(sums) / sum(counts)
    if mode == "sample_mean":
        return sum(sums[i] / counts[i] for i in with_loss) / len(with_loss)
    if mode == "seq_sum":
        return sum(sums[i] for i in with_loss) / len(with_loss)
    if mode == "sum":
        return sum(sums)
    return sum(sums) / C


def packed_loss(rank_batches, mode, dp_reduction, cap):
    """Each rank plans its batch; the loss is what the trainer's gradient computes."""
    options = dict(loss_mode=mode, dp_reduction=dp_reduction, sum_norm_constant=C)
    world_size = len(rank_batches)
    bounds = [
        planner.local_bound(lengths, cap, loss_tokens=[int(m.sum()) for m in masks])
        for lengths, _, masks in rank_batches
    ]
    k = max(b.k for b in bounds)  # the all-reduce MAX
    counts = tuple(sum(b.loss_counts[j] for b in bounds) for j in range(2))  # the all-reduce SUM
    total = 0.0
    for lengths, losses, masks in rank_batches:
        plan = planner.partition(
            lengths,
            k,
            cap,
            global_counts=counts,
            world_size=world_size,
            loss_tokens=[int(m.sum()) for m in masks],
            **options,
        )
        assert plan.num_micro_batches == k
        for mb, meta in zip(plan.micro_batches, plan.metadata):
            sums = [float(np.sum(losses[i] * masks[i])) for i in mb]
            total += sum(plan.loss_weights[i] * s for i, s in zip(mb, sums))
            if not math.isnan(meta.loss_scale) and mb:  # a common weight: one scale per micro-batch
                assert all(plan.loss_weights[i] == meta.loss_scale for i in mb)
    # Gradients averaged over ranks ("mean") divide the summed objective by W.
    return total / world_size if dp_reduction == "mean" else total


def random_rank_batches(world_size, seed):
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(world_size):
        n = int(rng.integers(1, 24))
        lengths = rng.integers(1, 300, n).tolist()
        losses = [rng.random(length) * 5 for length in lengths]
        # Some sequences have no loss token at all (a masked prompt-only sample).
        masks = [
            (rng.random(length) < rng.choice([0.0, 0.5, 1.0])).astype(np.float64)
            for length in lengths
        ]
        batches.append((lengths, losses, masks))
    if all(m.sum() == 0 for _, _, masks in batches for m in masks):
        batches[0][2][0][:] = 1.0
    return batches


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dp_reduction", ["sum", "mean"])
def test_weighted_sum_equals_the_direct_loss(world_size, mode, dp_reduction):
    for seed in range(10):
        batches = random_rank_batches(world_size, seed * 7 + world_size)
        every = [x for batch in batches for x in zip(*batch)]
        expected = direct_loss([l for _, l, _ in every], [m for _, _, m in every], mode)
        got = packed_loss(batches, mode, dp_reduction, cap=400)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_sequences_without_loss_tokens_weigh_zero_only_where_the_mode_says():
    lengths, loss_tokens = [10, 20, 30], [0, 5, 7]
    weights = {
        mode: planner.plan_local(lengths, 100, loss_tokens=loss_tokens, loss_mode=mode).loss_weights
        for mode in MODES
    }
    assert weights["sample_mean"][0] == 0 and weights["seq_sum"][0] == 0
    for mode in ("token_mean", "sum", "sum_norm"):
        assert len(set(weights[mode])) == 1 and weights[mode][0] > 0


def test_loss_scale_is_nan_where_weights_differ_and_zero_for_empty_micro_batches():
    plan = planner.partition([10, 20, 30], 4, 100, loss_tokens=[1, 2, 3], loss_mode="sample_mean")
    for mb, meta in zip(plan.micro_batches, plan.metadata):
        if not mb:
            assert meta.loss_scale == 0.0
        elif len({plan.loss_weights[i] for i in mb}) > 1:
            assert math.isnan(meta.loss_scale)
