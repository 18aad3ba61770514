#!/usr/bin/env python3
"""What group constraints cost a forest in coordinator mode (docs/design.md "Tree packing",
group constraints): GRPO trees balanced over W ranks by packsched.planner.balance without
group_ids (the baseline, same run), with one group per tree, and with groups that cut across the
trees (each rollout given one of --labels groups at random, so a prompt is forwarded once per
group that reaches it). Prints a markdown table: tokens forwarded, the step (BalanceBatch's
step_sync_cost), the agreed k, the ranks holding a rollout and the call's wall time.

    PYTHONPATH=build/python .venv/bin/python tests/bench/tree_groups_bench.py --seed 901
"""

import argparse
import time

import numpy as np

from packsched import planner
from packsched.tree import forest_from_groups


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=901)
    parser.add_argument("--trees", type=int, default=24)
    parser.add_argument("--n", type=int, default=8, help="rollouts per tree")
    parser.add_argument("--labels", type=int, default=32, help="groups across the trees")
    parser.add_argument("--world_size", type=int, default=8)
    parser.add_argument("--cap", type=int, default=16384)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    forest = forest_from_groups(
        rng.integers(500, 4001, args.trees),
        [rng.integers(100, 2501, args.n) for _ in range(args.trees)],
    )
    rollouts = len(forest.rollout_leaf)
    schemes = [
        ("none (baseline)", None),
        ("one group per tree", [r // args.n for r in range(rollouts)]),
        (f"{args.labels} groups across the trees", rng.integers(0, args.labels, rollouts).tolist()),
    ]
    print(
        f"seed {args.seed}: {args.trees} trees x {args.n} rollouts, W = {args.world_size}, "
        f"cap {args.cap}, flat tokens {int(forest.rollout_len.sum()):,}\n"
    )
    print("| group_ids | tokens forwarded | step | k | ranks holding a rollout | ms |")
    print("|---|---|---|---|---|---|")
    base = None
    for name, group_ids in schemes:
        start = time.perf_counter()
        balanced = planner.balance(
            forest, args.world_size, args.cap, group_ids=group_ids, align_to=8, progress=False
        )
        ms = 1000 * (time.perf_counter() - start)
        forwarded = sum(r.plan.forwarded_tokens for r in balanced.ranks)
        step = balanced.step.step_sync_cost
        base = base or (forwarded, step)
        held = sum(1 for r in balanced.ranks if r.indices)
        print(
            f"| {name} | {forwarded:,} ({forwarded / base[0]:.3f}x) | {step:,} "
            f"({step / base[1]:.3f}x) | {balanced.num_micro_batches} | {held} | {ms:.1f} |"
        )


if __name__ == "__main__":
    main()
