#!/usr/bin/env python3
"""Per-rank time of the tree CP shard attention (packsched.tree_kernels.tree_cp_attention, forward
and backward, CPU backend) with the query-row map, each rank computing only the rows it holds
("own rows"), against computing every row of the micro-batch as the unsharded call does ("all
rows", all_rows=True: the same call without the map), in one run on the same inputs.

Mixes: tests/bench/tree_bench.py's GRPO groups (n = 8) and agentic multi-turn traces, Python's
Mersenne Twister, seed given; plan_local(forest, cap, context_parallel=cp, overlong="isolate");
the first micro-batches of at most ``cap`` rows. Per micro-batch and rank the best of ``reps``
runs, the two modes interleaved per rank; the table gives per (mix, cp) the mean and the slowest
rank's time summed over the micro-batches, and all rows over own rows. All rows is cheaper per
row than own rows: the rows a rank does not hold have zero output gradients, so the backward
skips their dS products (the ideal ratio is below cp).

    PYTHONPATH=build/python .venv/bin/python tests/bench/tree_cp_attention_bench.py \
        [--seed 23] [--cap 4096] [--micro-batches 2] [--reps 2]
"""
import argparse
import pathlib
import random
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from packsched import planner, tree_kernels  # noqa: E402
from tree_bench import agentic_forest, grpo_forest  # noqa: E402


def layouts(forest, cap, cp, count):
    plan = planner.plan_local(forest, cap, context_parallel=cp, overlong="isolate")
    out = []
    for mb in plan.micro_batches:
        if mb.meta.empty or mb.meta.total > cap:
            continue
        positions, subtree_end = mb.rows(forest)
        cu = [int(c) for c in mb.meta.cu_seqlens_aligned]
        if cu[-1] < mb.meta.total:
            cu.append(int(mb.meta.total))
        out.append((cu, np.asarray(positions), np.asarray(subtree_end)))
        if len(out) == count:
            break
    return out


def rank_time(cu, positions, subtree_end, cp, rank, all_rows, reps, shape):
    heads, kv_heads, dim = shape
    rows = cu[-1]
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(rows, h, dim, generator=gen) for h in (heads, kv_heads, kv_heads))
    m = tree_kernels.tree_cp_rows(cu, positions, cp, rank)
    d_out = torch.randn(len(m), heads, dim, generator=gen)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    se = torch.tensor(subtree_end, dtype=torch.int32)
    max_seqlen = max(b - a for a, b in zip(cu, cu[1:]))
    best = float("inf")
    for _ in range(reps):
        qs = tree_kernels.tree_cp_shard(q, m).requires_grad_()
        kk, vv = k.clone().requires_grad_(), v.clone().requires_grad_()
        start = time.perf_counter()
        out = tree_kernels.tree_cp_attention(
            qs, kk, vv, m, cu_t, max_seqlen, se, cu_seqlens_host=cu, all_rows=all_rows
        )
        (out * d_out).sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--cap", type=int, default=4096)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=256)
    args = parser.parse_args()
    shape = (8, 2, 64)
    rng = random.Random(args.seed)
    forests = {
        "grpo-8": grpo_forest(args.rollouts, 8, rng),
        "agentic": agentic_forest(args.rollouts // 8, rng),
    }
    print(
        f"seed {args.seed}, cap {args.cap}, {args.micro_batches} micro-batches, float32 "
        f"H = {shape[0]}, Hk = {shape[1]}, D = {shape[2]}, forward + backward, best of {args.reps}"
    )
    print(
        "| mix | cp | rows | all rows: mean rank (s) | all rows: slowest (s) | "
        "own rows: mean rank (s) | own rows: slowest (s) | all / own (slowest) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, forest in forests.items():
        for cp in (2, 4):
            mbs = layouts(forest, args.cap, cp, args.micro_batches)
            a, o = np.zeros(cp), np.zeros(cp)
            for cu, pos, se in mbs:
                for r in range(cp):  # interleaved, so both see the same machine load
                    a[r] += rank_time(cu, pos, se, cp, r, True, args.reps, shape)
                    o[r] += rank_time(cu, pos, se, cp, r, False, args.reps, shape)
            rows = sum(cu[-1] for cu, _, _ in mbs)
            print(
                f"| {name} | {cp} | {rows} | {a.mean():.3f} | {a.max():.3f} | {o.mean():.3f} | "
                f"{o.max():.3f} | {a.max() / o.max():.2f} |"
            )


if __name__ == "__main__":
    main()
