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


# Mix shapes: (prompt median, sigma, min, max), (completion median, sigma, min, max), agentic
# (system prompt range, turns range, tool output range).
SHAPES = {
    "base": ((1024, 1.0, 256, 8192), (512, 1.0, 128, 4096), ((256, 2048), (3, 10), (200, 2000))),
    "long": ((3072, 0.7, 512, 12288), (1024, 0.6, 64, 4096), ((1024, 4096), (2, 6), (500, 4000))),
}


def grpo_forest(rollouts, n, rng, shape="base"):
    prompt, completion, _ = SHAPES[shape]
    groups = max(1, rollouts // n)
    prompts = [lognormal(rng, *prompt) for _ in range(groups)]
    completions = [[lognormal(rng, *completion) for _ in range(n)] for _ in range(groups)]
    return forest_from_groups(prompts, completions)


def agentic_forest(rollouts, rng, shape="base"):
    system, turns, tool = SHAPES[shape][2]
    node_len, parent, leaf = [], [], []

    def node(length, up):
        node_len.append(length)
        parent.append(up)
        return len(node_len) - 1

    while len(leaf) < rollouts:
        at = node(rng.randint(*system), -1)
        for _ in range(rng.randint(*turns)):
            action = lambda: lognormal(rng, 128, 1.0, 32, 1024)  # noqa: E731
            branch = node(action(), at)
            leaf.append(node(rng.randint(*tool), branch))
            at = node(rng.randint(*tool), node(action(), at))
        leaf.append(at)
    return Forest(np.array(node_len), np.array(parent), np.array(leaf))


def fewest_tokens(forest, cap, exact_up_to=14):
    """A floor under the tokens any plan of ``forest`` forwards at ``cap`` (overlong rollouts
    isolated), per split tree (a tree over the cap): {root: (floor, exact)}. The floor is the
    exact minimum over every partition of its rollouts into pieces within the cap (a subset DP,
    ``exact`` True) when it has at most ``exact_up_to`` rollouts within the cap, else
    Forest.forwarded_lower_bound of the tree; a tree within the cap forwards its unique tokens
    and is left out."""
    n = forest.num_nodes
    root = np.arange(n)
    for i in range(n):
        if forest.node_parent[i] >= 0:
            root[i] = root[forest.node_parent[i]]
    tree_tokens = np.bincount(root, weights=forest.node_len, minlength=n).astype(np.int64)
    leaf_root = root[forest.rollout_leaf]
    split = {}
    for r in np.flatnonzero(forest.node_parent < 0):
        rollouts = np.flatnonzero(leaf_root == r)
        if tree_tokens[r] <= cap:
            continue
        lens = forest.rollout_len[rollouts]
        over = int(lens[lens > cap].sum())  # isolated: forwarded alone
        kept = rollouts[lens <= cap]
        nodes = np.flatnonzero(root == r)
        if len(kept) > exact_up_to:
            index = {int(v): k for k, v in enumerate(nodes)}
            tree = Forest(
                forest.node_len[nodes],
                [index[int(p)] if p >= 0 else -1 for p in forest.node_parent[nodes]],
                [index[int(forest.rollout_leaf[j])] for j in rollouts],
            )
            split[int(r)] = (tree.forwarded_lower_bound(cap), False)
        else:
            split[int(r)] = (over + exact_tree_minimum(forest, kept, cap), True)
    whole = int(tree_tokens[forest.node_parent < 0].sum()) - int(sum(tree_tokens[r] for r in split))
    return whole, split


def tree_tokens_of(plan, forest):
    """The tokens ``plan`` forwards per tree: {root: tokens}."""
    root = np.arange(forest.num_nodes)
    for i in range(forest.num_nodes):
        if forest.node_parent[i] >= 0:
            root[i] = root[forest.node_parent[i]]
    out = {}
    for mb in plan.micro_batches:
        per = np.bincount(root[mb.nodes], weights=forest.node_len[mb.nodes], minlength=len(root))
        for r in np.flatnonzero(per):
            out[int(r)] = out.get(int(r), 0) + int(per[r])
    return out


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
    whole, split = fewest_tokens(forest, cap)
    planned = tree_tokens_of(tree, forest)
    above = [planned[r] / floor - 1.0 for r, (floor, exact) in split.items() if exact]
    above_bound = [planned[r] / floor - 1.0 for r, (floor, exact) in split.items() if not exact]
    return {
        "mix": name,
        "rollouts": forest.num_rollouts,
        "unique": forest.unique_tokens,
        "flat_tokens": forest.rollout_tokens,
        "tree_tokens": tree.forwarded_tokens,
        "over_unique": tree.forwarded_tokens / forest.unique_tokens - 1.0,
        "fewest": whole + sum(floor for floor, _ in split.values()),
        "split": len(split),
        "exact": len(above),
        "above_exact": sum(1 for a in above if a > 0),
        "worst_exact": max(above, default=0.0),
        "worst_bound": max(above_bound, default=0.0),
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
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    forests = {f"grpo-{n}": grpo_forest(args.rollouts, n, rng, args.shape) for n in (8, 16, 64)}
    forests["agentic"] = agentic_forest(args.rollouts, rng, args.shape)

    print(
        f"cap {args.cap} tokens, about {args.rollouts} rollouts per mix, seed {args.seed}, "
        f"shape {args.shape}"
    )
    print(
        "| mix | rollouts | flat tokens | tree tokens | tree / unique | flat attention | "
        "tree attention | flat k | tree k | pieces | fewest / unique | tree / fewest |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    cuts = []
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
        cuts.append(m)
    print()
    print(
        "| mix | split trees | of them exact (<= 14 rollouts) | above the exact minimum | "
        "worst over it | worst over the bound (> 14 rollouts) |"
    )
    print("|---|---|---|---|---|---|")
    for m in cuts:
        print(
            f"| {m['mix']} | {m['split']} | {m['exact']} | {m['above_exact']} | "
            f"{100 * m['worst_exact']:.2f}% | {100 * m['worst_bound']:.2f}% |"
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
