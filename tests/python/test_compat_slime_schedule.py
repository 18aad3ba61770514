"""packsched.compat.slime.build_dp_schedule against slime's documented behaviour.

The cases restate, in our own words, the scenarios slime's own tests of its ``build_dp_schedule``
cover (static and dynamic batch size, balancing, VPP alignment, an over-cap sample, rollout
grouping and trimming, token-budget steps, the packing safety margin, too few rollouts), checked
against the invariants slime documents: every rank runs the same count, each rank's micro-batches
tile its samples in order, every kept sample is placed once, a micro-batch over the cap holds one
sample, and no micro-batch is empty.
"""

from types import SimpleNamespace

import pytest

from packsched.compat import slime
from packsched.compat.verl import calculate_workload


def args_of(**overrides):
    base = dict(
        micro_batch_size=1,
        use_dynamic_batch_size=False,
        max_tokens_per_gpu=None,
        packing_safety_margin=1.0,
        global_batch_tokens=None,
        balance_data=False,
        multimodal_aware_packing="off",
    )
    return SimpleNamespace(**{**base, **overrides})


def parallel(dp_size=1, cp_size=1, vpp_size=1, group=1):
    return dict(
        dp_size=dp_size,
        cp_size=cp_size,
        vpp_size=vpp_size,
        microbatch_group_size_per_vp_stage=group,
    )


def schedule(lengths, args, config, gbs, rollouts=None):
    rollouts = list(range(len(lengths))) if rollouts is None else rollouts
    return slime.build_dp_schedule(
        args, config, lengths, global_batch_size=gbs, rollout_indices=rollouts
    )


def check(result, lengths, dp_size, kept, cap=None):
    partitions, mbi, nmb, _ = result
    assert len(partitions) == len(mbi) == dp_size
    placed = []
    for r in range(dp_size):
        assert len(mbi[r]) == sum(nmb)  # the same count on every rank
        assert [i for mb in mbi[r] for i in mb] == list(range(len(partitions[r])))
        assert all(mb for mb in mbi[r])  # never an empty micro-batch
        placed += partitions[r]
        if cap is not None:
            for mb in mbi[r]:
                tokens = sum(lengths[partitions[r][i]] for i in mb)
                assert tokens <= cap or len(mb) == 1
    assert sorted(placed) == sorted(kept)


def test_static_chunks_dealt_round_robin_in_one_step():
    lengths = [10] * 16
    result = schedule(lengths, args_of(micro_batch_size=2), parallel(dp_size=4), 16)
    assert result[2] == [2] and result[3] == [16]
    check(result, lengths, 4, range(16))
    # Strided: rank r has chunks r and r + 4 of the samples in order.
    assert result[0][0] == [0, 1, 8, 9]


def test_static_with_balancing_over_two_steps():
    lengths = [1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1]
    result = schedule(lengths, args_of(micro_batch_size=2, balance_data=True), parallel(2), 8)
    assert result[2] == [2, 2] and result[3] == [8, 8]
    check(result, lengths, 2, range(16))


def test_balancing_evens_the_ranks_work_better_than_round_robin():
    lengths = [1, 2, 3, 4, 5, 7, 9, 10]

    def spread(balance):
        partitions, _, nmb, _ = schedule(lengths, args_of(balance_data=balance), parallel(2), 8)
        assert nmb == [4]
        work = [sum(calculate_workload(lengths[i]) for i in p) for p in partitions]
        return max(work) - min(work)

    assert spread(True) < spread(False)


def test_a_static_count_that_is_not_aligned_is_refused():
    with pytest.raises(ValueError, match="not a multiple of dp_size"):
        schedule([10] * 6, args_of(micro_batch_size=2), parallel(dp_size=2), 6)


def test_dynamic_uniform_lengths_keep_the_cap():
    lengths = [5] * 8
    result = schedule(
        lengths, args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=10), parallel(2), 8
    )
    assert result[3] == [8]
    check(result, lengths, 2, range(8), cap=10)
    assert result[2] == [2]  # 40 tokens under a cap of 10: four micro-batches, two a rank


def test_a_sample_over_the_cap_runs_alone():
    lengths = [15, 3, 3, 3, 3, 3, 3, 3]
    partitions, mbi, nmb, gbs = result = schedule(
        lengths, args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=10), parallel(2), 8
    )
    check(result, lengths, 2, range(8), cap=10)
    alone = [
        [partitions[r][i] for i in mb]
        for r in range(2)
        for mb in mbi[r]
        if 0 in [partitions[r][i] for i in mb]
    ]
    assert alone == [[0]]


def test_vpp_rounds_each_ranks_count_to_the_group():
    lengths = [4] * 32
    result = schedule(
        lengths,
        args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=8),
        parallel(dp_size=2, vpp_size=2, group=2),
        16,
    )
    assert all(n % 2 == 0 for n in result[2])
    check(result, lengths, 2, range(32), cap=8)


def test_a_rollouts_samples_stay_in_one_step():
    rollouts = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    lengths = [3] * 9
    partitions, mbi, nmb, gbs = result = schedule(
        lengths,
        args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=12),
        parallel(1),
        1,
        rollouts,
    )
    assert gbs == [1, 1, 1]
    check(result, lengths, 1, range(9), cap=12)
    cursor, steps = 0, []
    for n in nmb:
        steps.append(sorted(partitions[0][i] for mb in mbi[0][cursor : cursor + n] for i in mb))
        cursor += n
    assert steps == [[0, 1, 2], [3, 4], [5, 6, 7, 8]]


def test_trailing_rollouts_that_do_not_fill_a_step_are_left_out():
    rollouts = [0, 0, 1, 2, 2, 3, 4, 4]
    lengths = [3] * 8
    result = schedule(
        lengths,
        args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=12),
        parallel(1),
        2,
        rollouts,
    )
    assert result[3] == [2, 2]
    check(result, lengths, 1, range(6), cap=12)


def test_a_token_budget_forms_steps_of_aligned_runs_nearest_it():
    lengths = [8, 8, 8, 8, 2, 2, 2, 2]
    args = args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=12, global_batch_tokens=20)
    result = schedule(lengths, args, parallel(2), 8)
    assert result[3] == [2, 4, 2]
    check(result, lengths, 2, range(8), cap=12)


def test_the_safety_margin_shrinks_the_cap():
    lengths = [6] * 4
    args = args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=12, packing_safety_margin=0.5)
    result = schedule(lengths, args, parallel(1), 4)
    assert result[2] == [4]
    check(result, lengths, 1, range(4), cap=6)


def test_fewer_rollouts_than_a_step_is_refused():
    with pytest.raises(ValueError, match="no complete step"):
        schedule(
            [3] * 6,
            args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=12),
            parallel(1),
            4,
            [0, 0, 1, 1, 2, 2],
        )


def test_no_rank_gets_an_empty_micro_batch_when_the_alignment_asks_for_more():
    # One micro-batch would hold everything, but four ranks need one each.
    lengths = [10, 1, 1, 1]
    result = schedule(
        lengths, args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=100), parallel(4), 4
    )
    assert result[2] == [1]
    check(result, lengths, 4, range(4), cap=100)
    # Two ranks in VPP groups of two need four micro-batches: three samples cannot fill them.
    with pytest.raises(ValueError, match="without an empty one"):
        schedule(
            [10, 1, 1],
            args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=100),
            parallel(dp_size=2, vpp_size=2, group=2),
            3,
        )


def test_the_dynamic_count_is_never_above_first_fit():
    import random

    rng = random.Random(5)
    for _ in range(20):
        lengths = [rng.randint(1, 4000) for _ in range(64)]
        _, _, nmb, _ = schedule(
            lengths, args_of(use_dynamic_batch_size=True, max_tokens_per_gpu=8192), parallel(2), 64
        )
        bins = []
        for length in lengths:  # slime's first fit, in order
            for b in bins:
                if b[0] + length <= 8192:
                    b[0] += length
                    break
            else:
                bins.append([length])
        first_fit = -(-len(bins) // 2) * 2
        assert nmb[0] * 2 <= first_fit


def test_the_removed_count_helper_still_answers_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="build_dp_schedule"):
        assert slime.get_minimum_num_micro_batch_size([6, 6, 6], 12) == 2


DYNAMIC = dict(use_dynamic_batch_size=True, max_tokens_per_gpu=12)


@pytest.mark.parametrize(
    "case, lengths, overrides, config, gbs, rollouts, message",
    [
        ("too few rollouts", [3] * 6, DYNAMIC, {}, 4, [0, 0, 1, 1, 2, 2], "num_rollouts"),
        (
            "no token step",
            [3] * 3,
            dict(DYNAMIC, global_batch_tokens=9),
            {"dp_size": 2},
            3,
            None,
            "num_rollouts",
        ),
        ("fewer samples than ranks", [3] * 4, DYNAMIC, {"dp_size": 4}, 1, [0, 0, 1, 1], "dp_size"),
        ("no cap", [3] * 4, dict(use_dynamic_batch_size=True), {}, 4, None, "max_tokens_per_gpu"),
        ("no static size", [3] * 4, dict(micro_batch_size=None), {}, 4, None, "micro_batch_size"),
        (
            "static not aligned",
            [10] * 6,
            dict(micro_batch_size=2),
            {"dp_size": 2},
            6,
            None,
            "not a multiple of dp_size",
        ),
        (
            "dynamic cannot align",
            [10, 1, 1],
            DYNAMIC,
            {"dp_size": 2, "vpp_size": 2, "group": 2},
            3,
            None,
            "without an empty one",
        ),
    ],
)
def test_where_slime_asserts_the_error_is_an_assertion_error_and_a_value_error(
    case, lengths, overrides, config, gbs, rollouts, message
):
    # slime's callers (and its own tests) catch AssertionError here; packsched's catch ValueError.
    with pytest.raises(AssertionError, match=message) as caught:
        schedule(lengths, args_of(**overrides), parallel(**config), gbs, rollouts)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, slime.PackschedSlimeError)


def test_a_multimodal_flag_per_sample_of_another_length_is_asserted_as_slime_does():
    with pytest.raises(AssertionError, match="sample_is_multimodal"):
        slime.build_dp_schedule(
            args_of(**DYNAMIC),
            parallel(),
            [3, 3],
            global_batch_size=2,
            rollout_indices=[0, 1],
            sample_is_multimodal=[False],
        )


def test_where_slime_raises_value_error_or_checks_nothing_it_stays_a_plain_value_error():
    for overrides, rollouts in ((dict(DYNAMIC, global_batch_tokens=0), [0, 1]), (DYNAMIC, [0])):
        with pytest.raises(ValueError) as caught:
            schedule([3, 3], args_of(**overrides), parallel(), 2, rollouts)
        assert not isinstance(caught.value, AssertionError)
