#!/usr/bin/env python3
"""The planner from Python against its own C++ time (docs/benchmarks.md, "The planner from
Python"), in one process and one run:

- C++: the planner call alone, timed inside the binding (``_planner.planner_seconds``: no
  conversion, the GIL released);
- binding: ``_planner.plan_columns`` / ``balance_columns``, the columns packsched.planner reads;
- ``packsched.planner.plan_local`` / ``partition`` / ``balance`` as a user calls them, and the
  same followed by reading every list of the result (each rank's indices and plan, every
  micro-batch's indices and metadata, reorder and revert): what the lazy lists defer;
- the previous path, the baseline: ``_planner.plan`` / ``balance`` (dicts and lists of Python
  objects) with the Plans built from them as packsched.planner built them before.

Lengths: a long-tailed RL mix (lognormal, median about 1,500 tokens, clipped to [16, 16,384]),
from --seed (pick one you have not looked at). Each case is run --repeat times, the columns
interleaved (each repeat starting at the next column); the table gives medians and each column's
ratio to C++.

    PYTHONPATH=build/python .venv/bin/python tests/bench/python_planner_bench.py --seed 9 \\
        [--repeat 5]
"""

import argparse
import statistics
import time

import numpy as np

from packsched import _planner, planner
from packsched._options import split_options
from packsched.plan import Plan
from packsched.planner import Balanced, RankPlan, StepStats


def lengths_of(n, seed):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(1500), 1.0, n), 16, 16384).astype(np.int64)


def read_all(result):
    """Reads every list of a Plan or a Balanced (what the lazy lists defer)."""
    plans = [result] if isinstance(result, Plan) else []
    if isinstance(result, Balanced):
        for rank in result.ranks:
            rank.indices  # noqa: B018 (read)
            plans.append(rank.plan)
    for plan in plans:
        plan.micro_batches, plan.metadata, plan.reorder, plan.revert  # noqa: B018


def previous_balance(lengths, world, cap):
    """packsched.planner.balance as it was: dicts from _planner.balance, Plans from them."""
    options, _ = split_options(cap, {}, where="balance", cap_required=True)
    raw = _planner.balance(lengths, world, options, [], "step", 0, None, {})
    ranks = [
        RankPlan(r["indices"], r["cost"], Plan.from_raw(r["plan"], cap=cap)) for r in raw["ranks"]
    ]
    return Balanced(ranks, raw["num_micro_batches"], raw["dropped"], StepStats(**raw["step"]))


def previous_plan(lengths, cap, k):
    options, _ = split_options(cap, {}, where="partition")
    return Plan.from_raw(_planner.plan(lengths, options, k, None), cap=cap)


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def case(name, lengths, cap, k, world, repeat):
    options, _ = split_options(cap, {}, where="balance", cap_required=True)
    if world:
        columns = {
            "C++": lambda: _planner.planner_seconds(lengths, options, 0, world),
            "binding": lambda: _planner.balance_columns(lengths, world, options, [], "step", 0),
            "packsched.planner": lambda: planner.balance(lengths, world, cap),
            "+ read every list": lambda: read_all(planner.balance(lengths, world, cap)),
            "previous path": lambda: previous_balance(lengths, world, cap),
        }
    else:
        call = (
            (lambda: planner.partition(lengths, k, cap))
            if k
            else (lambda: planner.plan_local(lengths, cap))
        )
        columns = {
            "C++": lambda: _planner.planner_seconds(lengths, options, k, 0),
            "binding": lambda: _planner.plan_columns(lengths, options, k),
            "packsched.planner": call,
            "+ read every list": lambda: read_all(call()),
            "previous path": lambda: previous_plan(lengths, cap, k),
        }
    times = {key: [] for key in columns}
    keys = list(columns)
    for i in range(repeat):
        # Each repeat starts at another column: none always runs first (on fresh pages).
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
            fn = columns[key]
            times[key].append(fn() if key == "C++" else timed(fn))
    medians = {key: statistics.median(values) for key, values in times.items()}
    cpp = medians["C++"]
    cells = [f"{medians[key]:.3f} ({medians[key] / cpp:.2f}x)" for key in columns]
    print(f"| {name} | " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(
        "| call | C++ s | binding s | packsched.planner s | + read every list s | "
        "previous path s |"
    )
    print("|---|---|---|---|---|---|")
    small, big = lengths_of(100_000, args.seed), lengths_of(1_000_000, args.seed + 1)
    k_small = planner.plan_local(small, 16384).num_micro_batches
    k_big = planner.plan_local(big, 65536).num_micro_batches
    case("balance, W = n = 100,000, cap 16,384", small, 16384, 0, 100_000, args.repeat)
    case("balance, n = 10^6, W = 1,024, cap 65,536", big, 65536, 0, 1024, args.repeat)
    case("plan_local, n = 100,000, cap 16,384", small, 16384, 0, 0, args.repeat)
    case("plan_local, n = 10^6, cap 65,536", big, 65536, 0, 0, args.repeat)
    case(f"partition, n = 100,000, k = {k_small}", small, 16384, k_small, 0, args.repeat)
    case(f"partition, n = 10^6, k = {k_big}", big, 65536, k_big, 0, args.repeat)


if __name__ == "__main__":
    main()
