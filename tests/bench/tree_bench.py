#!/usr/bin/env python3
"""Tree packing against flat packing, in one run: tokens forwarded, attention work and the
micro-batch count k on GRPO mixes and agentic multi-turn traces, and the in-process planning
time of a forest.

- grpo-n: groups of n rollouts sharing one prompt; prompts lognormal (median 1,024 tokens,
  sigma 1.0) clamped to [256, 8,192], completions lognormal (median 512, sigma 1.0) clamped to
  [128, 4,096].
- agentic: traces of 3 to 10 turns; a system prompt of 256 to 2,048 tokens, each turn a model
  action (lognormal median 128, clamped to [32, 1,024]) and a tool output (uniform 200 to 2,000
  tokens); at each turn the trace branches: a second action (and its tool output) forks off
  and ends there, the first goes on. Rollouts: every branch and the full trace.

Flat packing plans each rollout as its own sequence (packsched.planner.plan_local on the rollout
lengths); tree packing plans the forest (plan_local on a packsched.tree.Forest); both kk, the
tokens cost model, the same cap, overlong="isolate" (a rollout over the cap runs alone in both).
"attention" counts causal score pairs: a query row at position p attends to p + 1 keys (flat:
L (L + 1) / 2 per rollout; tree: over the packed rows of every piece), which the attention FLOPs
are proportional to. "fewest": a floor under the tokens any plan can forward at the cap
(fewest_tokens: exact per tree of up to 14 rollouts, else Forest.forwarded_lower_bound), so
"tree / fewest" is how far the planner's cut is from the best cut. Python's Mersenne Twister,
seed fixed.

    PYTHONPATH=build/python .venv/bin/python tests/bench/tree_bench.py [--rollouts 4096] \
        [--cap 65536] [--seed 1] [--repeat 5]
"""
import argparse
import math
import random
import statistics
import time

import numpy as np

from packsched import planner
from packsched.tree import Forest, forest_from_groups


def lognormal(rng, median, sigma, lo, hi):
    return int(min(max(rng.lognormvariate(math.log(median), sigma), lo), hi))


def grpo_forest(rollouts, n, rng):
    groups = max(1, rollouts // n)
    prompts = [lognormal(rng, 1024, 1.0, 256, 8192) for _ in range(groups)]
    completions = [[lognormal(rng, 512, 1.0, 128, 4096) for _ in range(n)] for _ in range(groups)]
    return forest_from_groups(prompts, completions)


def agentic_forest(rollouts, rng):
    node_len, parent, leaf = [], [], []

    def node(length, up):
        node_len.append(length)
        parent.append(up)
        return len(node_len) - 1

    while len(leaf) < rollouts:
        at = node(rng.randint(256, 2048), -1)
        for _ in range(rng.randint(3, 10)):
            action = lambda: lognormal(rng, 128, 1.0, 32, 1024)  # noqa: E731
            branch = node(action(), at)
            leaf.append(node(rng.randint(200, 2000), branch))
            at = node(rng.randint(200, 2000), node(action(), at))
        leaf.append(at)
    return Forest(np.array(node_len), np.array(parent), np.array(leaf))


def fewest_tokens(forest, cap, exact_up_to=14):
    """A floor under the tokens any plan of ``forest`` forwards at ``cap`` (overlong rollouts
    isolated): per tree, its unique tokens when it fits; the exact minimum over every partition
    of its rollouts into pieces within the cap (a subset DP) when it has at most
    ``exact_up_to`` rollouts within the cap; else Forest.forwarded_lower_bound of the tree."""
    n = forest.num_nodes
    root = np.arange(n)
    for i in range(n):
        if forest.node_parent[i] >= 0:
            root[i] = root[forest.node_parent[i]]
    tree_tokens = np.bincount(root, weights=forest.node_len, minlength=n).astype(np.int64)
    leaf_root = root[forest.rollout_leaf]
    total = 0
    for r in np.flatnonzero(forest.node_parent < 0):
        rollouts = np.flatnonzero(leaf_root == r)
        if tree_tokens[r] <= cap:
            total += int(tree_tokens[r])
            continue
        lens = forest.rollout_len[rollouts]
        total += int(lens[lens > cap].sum())  # isolated: forwarded alone
        kept = rollouts[lens <= cap]
        nodes = np.flatnonzero(root == r)
        if len(kept) > exact_up_to:
            index = {int(v): k for k, v in enumerate(nodes)}
            tree = Forest(
                forest.node_len[nodes],
                [index[int(p)] if p >= 0 else -1 for p in forest.node_parent[nodes]],
                [index[int(forest.rollout_leaf[j])] for j in kept],
            )
            total += tree.forwarded_lower_bound(cap)
            continue
        total += exact_tree_minimum(forest, kept, cap)
    return total


def exact_tree_minimum(forest, rollouts, cap):
    """The fewest tokens forwarded by pieces (sets of whole rollouts, each piece forwarding the
    union of its rollouts' paths once, within ``cap``) covering ``rollouts`` of one tree."""
    m = len(rollouts)
    through = {}  # node -> mask of the rollouts whose path holds it
    for b, j in enumerate(rollouts):
        for node in forest.path(int(j)):
            through[node] = through.get(node, 0) | (1 << b)
    masks = np.arange(1 << m, dtype=np.int64)
    cost = np.zeros(1 << m, dtype=np.int64)
    for node, mask in through.items():
        cost += np.where(masks & mask, forest.node_len[node], 0)
    feasible = masks[(cost <= cap) & (masks > 0)]
    best = np.zeros(1 << m, dtype=np.int64)
    for s in range(1, 1 << m):
        low = s & -s
        pieces = feasible[((feasible & s) == feasible) & ((feasible & low) != 0)]
        best[s] = (cost[pieces] + best[s ^ pieces]).min()
    return int(best[-1])


def attention_pairs_flat(lengths):
    lengths = np.asarray(lengths, dtype=np.int64)
    return int((lengths * (lengths + 1) // 2).sum())


def attention_pairs_tree(plan, forest):
    total = 0
    for mb in plan.micro_batches:
        lens = forest.node_len[mb.nodes]
        # Rows of entry e: positions position[e] .. position[e] + len - 1; each attends pos + 1.
        total += int((lens * mb.position + lens * (lens + 1) // 2).sum())
    return total


def measure(name, forest, cap):
    flat = planner.plan_local(forest.rollout_len, cap, overlong="isolate")
    tree = planner.plan_local(forest, cap, overlong="isolate")
    flat_attention = attention_pairs_flat(forest.rollout_len)
    tree_attention = attention_pairs_tree(tree, forest)
    return {
        "mix": name,
        "rollouts": forest.num_rollouts,
        "unique": forest.unique_tokens,
        "flat_tokens": forest.rollout_tokens,
        "tree_tokens": tree.forwarded_tokens,
        "over_unique": tree.forwarded_tokens / forest.unique_tokens - 1.0,
        "fewest": fewest_tokens(forest, cap),
        "flat_attention": flat_attention,
        "tree_attention": tree_attention,
        "flat_k": flat.num_micro_batches,
        "tree_k": tree.num_micro_batches,
        "pieces": sum(len(mb.meta.indices) for mb in tree.micro_batches),
    }


def timed(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=4096)
    parser.add_argument("--cap", type=int, default=65536)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    forests = {f"grpo-{n}": grpo_forest(args.rollouts, n, rng) for n in (8, 16, 64)}
    forests["agentic"] = agentic_forest(args.rollouts, rng)

    print(f"cap {args.cap} tokens, about {args.rollouts} rollouts per mix, seed {args.seed}")
    print(
        "| mix | rollouts | flat tokens | tree tokens | tree / unique | flat attention | "
        "tree attention | flat k | tree k | pieces | fewest / unique | tree / fewest |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, forest in forests.items():
        m = measure(name, forest, args.cap)
        print(
            f"| {m['mix']} | {m['rollouts']} | {m['flat_tokens']:,} | {m['tree_tokens']:,} "
            f"({m['tree_tokens'] / m['flat_tokens']:.3f}x) | {1 + m['over_unique']:.4f} | "
            f"{m['flat_attention']:.3e} | {m['tree_attention']:.3e} "
            f"({m['tree_attention'] / m['flat_attention']:.3f}x) | {m['flat_k']} | {m['tree_k']} "
            f"| {m['pieces']} | {m['fewest'] / m['unique']:.4f} | "
            f"{m['tree_tokens'] / m['fewest']:.4f} |"
        )
    print()
    print("| mix | rollouts | nodes | flat plan_local ms | tree plan_local ms |")
    print("|---|---|---|---|---|")
    for name, forest in forests.items():
        flat_ms = timed(
            lambda: planner.plan_local(forest.rollout_len, args.cap, overlong="isolate"),
            args.repeat,
        )
        tree_ms = timed(
            lambda: planner.plan_local(forest, args.cap, overlong="isolate"), args.repeat
        )
        print(
            f"| {name} | {forest.num_rollouts} | {forest.num_nodes} | {flat_ms:.2f} | "
            f"{tree_ms:.2f} |"
        )


if __name__ == "__main__":
    main()
