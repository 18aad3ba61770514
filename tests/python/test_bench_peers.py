"""The peers of tests/bench/schedule_bench.py follow the rules of the schedulers they stand for.

Each case is written from the peer's documented behaviour (its source's docstrings and tests),
not from our implementation: counts, the order a rank runs its micro-batches in, and what
happens at the cap.
"""

import pathlib
import random
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import schedule_bench as bench  # noqa: E402

CAP = 100


def covered(grid, n):
    return sorted(i for row in grid for part in row for i in part) == list(range(n))


def test_kk_equal_size_gives_equal_counts_and_ascending_lists_largest_sum_first():
    parts = bench.karmarkar_karp([1, 2, 3, 4, 5, 6], 2, equal_size=True)
    assert [len(p) for p in parts] == [3, 3]
    assert all(p == sorted(p) for p in parts)
    sums = [sum(i + 1 for i in p) for p in parts]
    assert sums == sorted(sums, reverse=True) and sums[0] - sums[1] <= 1


def test_kk_gives_largest_differencing_s_textbook_result():
    # 8, 7, 6, 5, 4 into two: differences 1 (8-7), 1 (6-5), then 4-1-1 leave 2, not the
    # optimal 0 (the method's standard example).
    parts = bench.karmarkar_karp([4, 5, 6, 7, 8], 2, equal_size=False)
    assert sorted(sum([4, 5, 6, 7, 8][i] for i in p) for p in parts) == [14, 16]


def test_nemo_rl_fills_extra_bins_from_the_fullest_and_deals_round_robin():
    # All four are tiny (at most cap / 6): one bin; two ranks need two bins: the new bin takes
    # the last sequence of the fullest bin.
    grid = bench.nemo_rl([10, 10, 10, 1], 2, CAP)
    assert grid == [[[0, 1, 2]], [[3]]]


def test_nemo_rl_packs_large_items_first_then_medium_then_fills_by_size():
    # Cap 100. Large (> 50): 60 and 52, each its own bin, the larger first. Medium (> 33): 45
    # joins the first large bin with room (60 has 40: no; 52 has 48: yes). The 60-bin has no
    # medium item, but the two smallest small items (20 + 22 > 40) do not fit: no pair. Then
    # largest first into it: 30, then 5 (22 and 20 no longer fit). The rest (22, 20) go to a
    # new bin. First fit decreasing would give [60, 30, 5], [52, 22], [45, 20] instead.
    lengths = [52, 60, 45, 20, 22, 30, 5]
    assert bench.modified_ffd(lengths, CAP) == [[1, 5, 6], [0, 2], [4, 3]]
    assert bench.nemo_rl(lengths, 3, CAP) == [[[1, 5, 6]], [[0, 2]], [[4, 3]]]


def test_nemo_rl_pairs_two_small_items_with_a_large_one_smallest_first():
    # 55 is large with room 45 and no medium item: it takes the smallest small item (18), then
    # the largest that still fits beside it (27 of 19, 26, 27 with room 27).
    lengths = [55, 18, 27, 19, 26]
    assert bench.modified_ffd(lengths, CAP)[0] == [0, 1, 2]


def test_nemo_rl_leftovers_go_to_the_least_filled_bin_and_bins_follow_their_fill():
    # No large item: 40 and 40 share a bin (80); 35 does not fit the least filled bin (80): a
    # new one; 10 goes to the least filled (35), not the first with room (80, as first fit
    # would). Bins come out least filled first.
    assert bench.modified_ffd([40, 40, 35, 10], CAP) == [[2, 3], [0, 1]]


@pytest.mark.parametrize("seed", range(5))
def test_nemo_rl_gives_every_rank_the_same_count_and_keeps_the_cap(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, CAP) for _ in range(rng.randint(8, 60))]
    for world in (2, 3, 8):
        grid = bench.nemo_rl(lengths, world, CAP)
        assert len({len(row) for row in grid}) == 1
        assert covered(grid, len(lengths))
        assert all(part and sum(lengths[i] for i in part) <= CAP for row in grid for part in row)
        # Bin b goes to rank b mod W: the ranks' first bins are the W first (largest-first) bins.
        assert max(lengths) in [lengths[row[0][0]] for row in grid]


def test_slime_first_fit_keeps_input_order_and_splits_the_heaviest_bin():
    # First fit in input order: one bin [0, 1, 2, 3] of 12 tokens under a cap of 12; two ranks
    # need two bins: longest first into the lighter half gives [6] and [4, 1, 1].
    grid = bench.slime([6, 1, 1, 4], 2, 12)
    assert sorted(grid) == [[[0]], [[3, 1, 2]]]


def test_slime_weighs_samples_by_its_model_flops():
    # slime's calculate_fwd_flops for its qwen3-8B model script, by hand: per token and layer
    # 2*4096*32*128 (Q) + 4*4096*8*128 (K, V) + 2*4096^2 (output) + 6*4096*12288 (MLP)
    # = 385,875,968, times 36 layers, plus 2*4096*151,936 (LM head) = 15,136,194,560; per
    # squared token 36 layers x 2*32*128 (causal Q K^T, then A V) = 294,912.
    for length in (1, 300, 16384, 131072):
        assert bench.slime_flops(length) == 15_136_194_560 * length + 294_912 * length**2


def test_slime_runs_a_sample_over_the_cap_alone_and_ranks_in_bin_order():
    lengths = [150, 10, 20, 30, 40, 50, 60, 70]
    grid = bench.slime(lengths, 2, CAP)
    assert len({len(row) for row in grid}) == 1 and covered(grid, len(lengths))
    for row in grid:
        for part in row:
            assert sum(lengths[i] for i in part) <= CAP or part == [0]
    # First fit in input order: bin 0 is [0] alone.
    assert [[0]] in [row[:1] for row in grid]


def test_verl_count_is_the_largest_ranks_ceiling_and_its_order_puts_light_ones_at_the_ends():
    lengths = [90, 80, 70, 60, 50, 40, 30, 20, 10, 5, 5, 5]
    grid = bench.verl(lengths, 2, CAP, retry=False)
    ranks = bench.karmarkar_karp([bench.cost(x) for x in lengths], 2, equal_size=True)
    k = max(min(len(r), -(-sum(lengths[i] for i in r) // CAP)) for r in ranks)
    assert all(len(row) == k for row in grid) and covered(grid, len(lengths))
    for row in grid:
        work = [sum(bench.cost(lengths[i]) for i in p) for p in row]
        by_work = sorted(work, reverse=True)
        assert work == by_work[::2][::-1] + by_work[1::2]


def test_verl_breaks_the_cap_where_its_count_is_too_low_and_retry_does_not():
    lengths = [60, 60, 60, 20]  # 200 tokens: ceil(200 / 100) = 2, but no 2-way split fits
    assert any(
        sum(lengths[i] for i in p) > CAP for row in bench.verl(lengths, 1, CAP, False) for p in row
    )
    fixed = bench.verl(lengths, 1, CAP, retry=True)
    assert all(sum(lengths[i] for i in p) <= CAP for row in fixed for p in row)


def test_the_checks_run_end_to_end_in_a_small_configuration():
    done = subprocess.run(
        [sys.executable, str(BENCH / "schedule_bench.py"), "--checks", "--quick", "--seeds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("sync=step: ") and "of 2 inputs" in lines[0]
    assert lines[1].startswith("sync=micro_batch, Pareto lengths") and "of 2 inputs" in lines[1]
