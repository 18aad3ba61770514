#!/usr/bin/env python3
"""Tree packing against flat packing for a hybrid model, in one run: tokens forwarded, CPU step
time (forward and backward) and the recurrent states kept alive at once per micro-batch.

The model is the tests' tiny hybrid model (tests/python/helpers/hybrid_lm.py: Gated DeltaNet,
attention, Mamba-2, Gated DeltaNet, attention), here at dim 64 (Gated DeltaNet 4 heads of 16 x
16, Mamba-2 8 heads of 8 with 2 groups of state 16, attention 4 heads of 16), float32, one torch
thread. Workloads (Python's Mersenne Twister, seed given):

- grpo: groups of 8 completions (32 to 160 tokens) sharing a prompt (64 to 320 tokens);
- turns: multi-turn trees, a prompt (64 to 256) and 3 levels of 2 or 3 branches (16 to 96
  tokens each), every leaf a rollout.

Flat packing plans every rollout as a sequence (plan_local on the lengths: flat_prev_rows,
varlen attention); tree packing plans the forest (plan_local on build_forest's Forest:
micro_batch_prev_rows, tree attention), both at the same cap; both arms run the same model on
the same rollouts, alternating within each step, after an untimed warm-up of both. "states" is
the peak of states_alive over the tree arm's micro-batches (branch-point states held besides the
running one, per layer and head) in the plan's order (children in ascending node index); "best
order" the peak if each node's children ran with the one needing most states last.

    PYTHONPATH=build/python .venv/bin/python tests/bench/hybrid_bench.py [--seed 11] [--steps 3]
"""

import argparse
import pathlib
import random
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python" / "helpers"))

import hybrid_lm  # noqa: E402
from packsched import kernels, planner, tree_kernels  # noqa: E402
from packsched.tree import build_forest  # noqa: E402

VOCAB = 61
SIZES = {
    "gdn": dict(heads=4, kd=16, vd=16),
    "mamba": dict(heads=8, hd=8, groups=2, state=16),
    "attn": dict(heads=4, hd=16),
}


def tokens(rng, lo, hi):
    return [rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))]


def grpo(rng, groups):
    rollouts, group_ids = [], []
    for g in range(groups):
        prompt = tokens(rng, 64, 320)
        for _ in range(8):
            rollouts.append(prompt + tokens(rng, 32, 160))
            group_ids.append(g)
    return rollouts, group_ids


def turns(rng, trees):
    rollouts, group_ids = [], []

    def grow(prefix, depth, g):
        for _ in range(rng.randint(2, 3)):
            path = prefix + tokens(rng, 16, 96)
            if depth < 2:
                grow(path, depth + 1, g)
            else:
                rollouts.append(path)
                group_ids.append(g)

    for g in range(trees):
        grow(tokens(rng, 64, 256), 0, g)
    return rollouts, group_ids


def step(model, ids, positions, ops, rows, rollouts):
    targets = tree_kernels.tree_targets(rows, rollouts, [1.0] * len(rollouts))
    logits = model(torch.as_tensor(ids), torch.as_tensor(positions), ops)
    loss = kernels.multi_target_cross_entropy(
        logits, torch.as_tensor(targets.rows), torch.as_tensor(targets.labels)
    )
    (loss * torch.as_tensor(targets.weights, dtype=loss.dtype)).sum().backward()


def fewest_states(parent):
    """The peak of states alive under the best child order (entries' parents, -1 for roots): a
    node is held while its children but the last run, so the child needing most goes last."""
    children = {}
    for e, p in enumerate(parent):
        children.setdefault(int(p), []).append(e)
    peak = {}
    for e in reversed(range(len(parent))):  # children come after their parent
        kids = sorted((peak[c] for c in children.get(e, [])), reverse=True)
        peak[e] = max([kids[0]] + [k + 1 for k in kids[1:]]) if kids else 0
    return max((peak[r] for r in children.get(-1, [])), default=0)


def run_tree(model, rollouts, group_ids, cap):
    forest = build_forest(rollouts, group_ids)
    plan = planner.plan_local(forest, cap, progress=False)
    forwarded, states, best = 0, 0, 0
    start = time.perf_counter()
    for mb in plan.micro_batches:
        positions, subtree_end = mb.rows(forest)
        cu = [int(c) for c in mb.meta.cu_seqlens_aligned]
        if cu[-1] < mb.meta.total:
            cu.append(int(mb.meta.total))
        prev = kernels.micro_batch_prev_rows(mb, forest)
        states = max(states, kernels.states_alive(prev))
        best = max(best, fewest_states(mb.parent))
        rows = [mb.rollout_rows(forest, i) for i in range(len(mb.rollouts))]
        held = [np.asarray(forest.rollout_token_ids(int(r))) for r in mb.rollouts]
        ops = hybrid_lm.Packed(prev, cu, torch.as_tensor(subtree_end, dtype=torch.int32))
        step(model, mb.input_ids(forest), positions.astype(np.int64), ops, rows, held)
        forwarded += int(mb.meta.total)
    return time.perf_counter() - start, forwarded, (states, best), len(plan.micro_batches)


def run_flat(model, rollouts, cap):
    plan = planner.plan_local([len(r) for r in rollouts], cap, progress=False)
    forwarded = 0
    start = time.perf_counter()
    for indices, meta in zip(plan.micro_batches, plan.metadata):
        cu = [int(c) for c in meta.cu_seqlens]
        held = [np.asarray(rollouts[i]) for i in indices]
        ids = np.concatenate(held)
        positions = np.concatenate([np.arange(b - a) for a, b in zip(cu, cu[1:])])
        rows = [np.arange(a, b) for a, b in zip(cu, cu[1:])]
        ops = hybrid_lm.Packed(kernels.flat_prev_rows(cu), cu)
        step(model, ids, positions, ops, rows, held)
        forwarded += cu[-1]
    return time.perf_counter() - start, forwarded, plan.num_micro_batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups per step")
    parser.add_argument("--trees", type=int, default=2, help="multi-turn trees per step")
    parser.add_argument("--cap", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    model = hybrid_lm.TinyHybridLM(dim=64, dtype=torch.float32, max_len=2048, sizes=SIZES)
    warm = grpo(random.Random(0), 1)  # first calls (imports, allocator) outside the timings
    run_flat(model, warm[0], args.cap)
    run_tree(model, *warm, args.cap)
    print(
        "| workload, step | micro-batches flat / tree | tokens forwarded flat / tree | "
        "step time flat | tree, same run | speed-up | states alive (peak) | best order |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in ("grpo", "turns"):
        for s in range(args.steps):
            rollouts, group_ids = (
                grpo(rng, args.groups) if name == "grpo" else turns(rng, args.trees)
            )
            flat_time, flat_tokens, flat_k = run_flat(model, rollouts, args.cap)
            tree_time, tree_tokens, (states, best), tree_k = run_tree(
                model, rollouts, group_ids, args.cap
            )
            print(
                f"| {name}, {s} | {flat_k} / {tree_k} | {flat_tokens:,} / {tree_tokens:,} | "
                f"{flat_time:.2f} s | {tree_time:.2f} s | {flat_time / tree_time:.2f}x | "
                f"{states} | {best} |"
            )


if __name__ == "__main__":
    main()
