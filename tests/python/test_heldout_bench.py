"""tests/bench/heldout_bench.py: its greedy follows the rule it states, its lower bound is below
every plan, and on a few inputs packsched keeps the claims the bench publishes."""

import pathlib
import random
import sys
import types

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import heldout_bench as held  # noqa: E402
import schedule_bench as bench  # noqa: E402


def test_greedy_takes_the_cell_that_least_raises_its_slot():
    # Cap 100, two ranks. 60 opens slot 0 on rank 0; 50 does not fit beside it, and rank 1's
    # empty cell raises nothing (alpha + c(50) < alpha + c(60)). 40 fits on both: beside 50 it
    # raises slot 0 by c(50) + c(40) - c(60), beside 60 by c(40), so rank 1. 30 fits only beside
    # 60, raising the slot by c(60) + c(30) - c(50) - c(40) = 400, far below a new slot's alpha.
    assert held.greedy([60, 50, 40, 30], 2, 100) == [[[0, 3]], [[1, 2]]]


def test_greedy_opens_a_slot_only_when_no_cell_takes_the_sequence():
    assert held.greedy([80, 80, 80], 2, 100) == [[[0], [2]], [[1], []]]


def test_slot_bound_is_below_every_plan_under_micro_batch_sync():
    rng = random.Random(7)
    for _ in range(30):
        world = rng.choice((2, 4, 8))
        cap = rng.choice((4096, 16384))
        lengths = held.pareto_mix(rng, world * rng.randint(2, 12), cap, rng.uniform(1.1, 2.5))
        bound = held.slot_bound(lengths, world, cap)
        for grid in (held.greedy(lengths, world, cap), bench.nemo_rl(lengths, world, cap)):
            cells = [
                [(held.ALPHA + sum(bench.cost(lengths[i]) for i in p)) if p else 0 for p in row]
                for row in grid
            ]
            k = max(len(c) for c in cells)
            cells = [c + [0] * (k - len(c)) for c in cells]
            assert bound <= sum(max(c[i] for c in cells) for i in range(k))


def test_a_few_inputs_keep_the_published_claims():
    args = types.SimpleNamespace(tuning=True, count=1, quick=True, baseline=None)
    rows = held.run(args)
    assert len(rows) == 28
    for row in rows:
        for sync in ("step", "micro_batch"):
            assert row[sync + "_over"] == 0
            assert row[sync] >= row[sync + "_peer_in"] - 0.002, (sync, row)
        if row["greedy_in"]:
            assert row["micro_batch"] >= row["greedy"] - 0.002, row
