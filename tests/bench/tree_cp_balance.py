#!/usr/bin/env python3
"""How evenly the tree shard map (packsched.tree_kernels.tree_cp_rows) spreads the attention work
of tree-packed micro-batches over the CP ranks, against the head-tail map of flat CP applied to
the same rows (segment_rows: chunk c and 2 cp - 1 - c of every piece), in one run.

A query row at depth p attends to p + 1 keys under the tree mask (its root path), so a rank's work
in a micro-batch is the sum of positions + 1 over its rows. Per micro-batch the figure is the
busiest rank's work over the mean (1 is perfect); the table gives its mean and its maximum over
the micro-batches of a plan (plan_local on the forest with context_parallel = cp, kk, the tokens
cost model, overlong="isolate"). Mixes: tests/bench/tree_bench.py's GRPO groups (n = 8, 16) and
agentic multi-turn traces, Python's Mersenne Twister, seed given.

    PYTHONPATH=build/python .venv/bin/python tests/bench/tree_cp_balance.py [--rollouts 1024] \
        [--cap 32768] [--seed 11]
"""
import argparse
import pathlib
import random
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from packsched import planner, tree_kernels  # noqa: E402
from packsched._cp_layout import segment_rows  # noqa: E402
from tree_bench import agentic_forest, grpo_forest  # noqa: E402


def head_tail_work(cu, positions, cp):
    work = np.zeros(cp, dtype=np.int64)
    for a, b in zip(cu, cu[1:]):
        for r in range(cp):
            for lo, hi in segment_rows(b - a, cp, r):
                work[r] += int((positions[a + lo : a + hi] + 1).sum())
    return work


def measure(forest, cap, cp):
    plan = planner.plan_local(forest, cap, context_parallel=cp, overlong="isolate")
    tree, flat = [], []
    for mb in plan.micro_batches:
        if mb.meta.empty:
            continue
        positions, _ = mb.rows(forest)
        positions = np.asarray(positions, dtype=np.int64)
        cu = [int(c) for c in mb.meta.cu_seqlens_aligned]
        w = np.asarray(tree_kernels.tree_cp_work(cu, positions, cp, total=mb.meta.total))
        h = head_tail_work(cu + ([mb.meta.total] if mb.meta.total > cu[-1] else []), positions, cp)
        tree.append(w.max() / w.mean())
        flat.append(h.max() / h.mean())
    return len(tree), np.mean(tree), np.max(tree), np.mean(flat), np.max(flat)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--cap", type=int, default=32768)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    forests = {f"grpo-{n}": grpo_forest(args.rollouts, n, rng) for n in (8, 16)}
    forests["agentic"] = agentic_forest(args.rollouts // 8, rng)
    print(f"cap {args.cap} tokens, about {args.rollouts} rollouts per GRPO mix, seed {args.seed}")
    print(
        "| mix | cp | micro-batches | tree map max/mean (mean) | tree map (worst) | "
        "head-tail max/mean (mean) | head-tail (worst) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, forest in forests.items():
        for cp in (2, 4, 8):
            n, tm, tw, hm, hw = measure(forest, args.cap, cp)
            print(f"| {name} | {cp} | {n} | {tm:.4f} | {tw:.4f} | {hm:.4f} | {hw:.4f} |")


if __name__ == "__main__":
    main()
