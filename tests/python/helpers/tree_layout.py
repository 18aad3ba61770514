"""A small reference builder of the tree-packed layout (docs/design.md, "Tree packing"), written
from the contract for the tests: forests of token runs, their rollouts, and the packed layout of a
micro-batch of whole trees. The planner's forest plan (packsched.tree + the sidecar) produces the
same layout (``to_tree_forest`` and ``planner_layouts`` turn it into a ``Layout``; a test checks
that the two agree row for row); the tests compare the kernels against this one.

A forest: ``node_len`` [N], ``node_parent`` [N] (-1 for a root, else an earlier node),
``rollout_leaf`` [R] (rollout r is the path root -> rollout_leaf[r]), and ``node_tokens`` (the
token ids of each node, for building ids and labels).
"""

import numpy as np

from packsched import tree


class Forest:
    def __init__(self, node_len, node_parent, rollout_leaf, node_tokens, node_trained):
        self.node_len = np.asarray(node_len, dtype=np.int64)
        self.node_parent = np.asarray(node_parent, dtype=np.int64)
        self.rollout_leaf = np.asarray(rollout_leaf, dtype=np.int64)
        self.node_tokens = [np.asarray(t, dtype=np.int64) for t in node_tokens]
        self.node_trained = list(node_trained)  # per node: are its tokens trained (loss mask)
        self.children = [[] for _ in self.node_len]
        for n, p in enumerate(self.node_parent):
            if p >= 0:
                self.children[p].append(n)

    def root_of(self, node):
        while self.node_parent[node] >= 0:
            node = self.node_parent[node]
        return int(node)

    def path(self, r):
        nodes, node = [], int(self.rollout_leaf[r])
        while node >= 0:
            nodes.append(node)
            node = int(self.node_parent[node])
        return nodes[::-1]

    def rollout(self, r):
        """(token ids, loss mask) of rollout r, as the unshared batch holds it."""
        nodes = self.path(r)
        ids = np.concatenate([self.node_tokens[n] for n in nodes])
        mask = np.concatenate(
            [np.full(self.node_len[n], self.node_trained[n], dtype=bool) for n in nodes]
        )
        return ids, mask

    def roots(self):
        return [n for n in range(len(self.node_len)) if self.node_parent[n] < 0]

    def rollouts_of(self, root):
        return [
            r for r in range(len(self.rollout_leaf)) if self.root_of(self.rollout_leaf[r]) == root
        ]

    def unique_tokens(self, root):
        stack, total = [root], 0
        while stack:
            n = stack.pop()
            total += int(self.node_len[n])
            stack.extend(self.children[n])
        return total


class Layout:
    """One micro-batch: ids, positions, subtree_end [T]; cu_seqlens (pieces); per rollout held
    (``rollouts``, global indices) its packed rows."""

    def __init__(self):
        self.ids, self.positions, self.subtree_end, self.cu = [], [], [], [0]
        self.rollouts, self.rows = [], []


def pack(forest, roots):
    """The packed layout of whole trees ``roots`` (one piece each): nodes in depth-first
    preorder, children in ascending index."""
    out = Layout()
    first = {}

    def visit(node, depth):
        first[node] = len(out.ids)
        n = int(forest.node_len[node])
        out.ids.extend(forest.node_tokens[node].tolist())
        out.positions.extend(range(depth, depth + n))
        out.subtree_end.extend([0] * n)
        for child in sorted(forest.children[node]):
            visit(child, depth + n)
        out.subtree_end[first[node] : first[node] + n] = [len(out.ids)] * n

    for root in roots:
        visit(root, 0)
        out.cu.append(len(out.ids))
        for r in forest.rollouts_of(root):
            out.rollouts.append(r)
            out.rows.append(
                np.concatenate(
                    [np.arange(first[n], first[n] + forest.node_len[n]) for n in forest.path(r)]
                )
            )
    return out


def to_tree_forest(forest, roots):
    """The trees ``roots`` of ``forest`` as a packsched.tree.Forest (nodes renumbered in their
    order, so parents still come first; node_tokens kept), and the global index of each of its
    rollouts, ascending."""
    keep = set(roots)
    nodes = [n for n in range(len(forest.node_len)) if forest.root_of(n) in keep]
    new_id = {n: i for i, n in enumerate(nodes)}
    rollouts = [
        r for r in range(len(forest.rollout_leaf)) if forest.root_of(forest.rollout_leaf[r]) in keep
    ]
    parents = [
        -1 if forest.node_parent[n] < 0 else new_id[int(forest.node_parent[n])] for n in nodes
    ]
    out = tree.Forest(
        forest.node_len[nodes],
        np.asarray(parents, dtype=np.int64),
        np.asarray([new_id[int(forest.rollout_leaf[r])] for r in rollouts], dtype=np.int64),
        node_tokens=np.concatenate([forest.node_tokens[n] for n in nodes]),
    )
    return out, rollouts


def planner_layouts(tree_forest, rollouts, plan):
    """One ``Layout`` per micro-batch of the planner's ``plan`` (a packsched.tree.TreePlan over
    ``tree_forest``), its rollouts by global index (``rollouts`` as to_tree_forest gives them).
    The rows past the aligned pieces (align_total_to) are one more segment of ``cu``."""
    layouts = []
    for mb in plan.micro_batches:
        out = Layout()
        out.ids = mb.input_ids(tree_forest)
        out.positions, out.subtree_end = mb.rows(tree_forest)
        out.cu = [int(c) for c in mb.meta.cu_seqlens_aligned]
        if out.cu[-1] < mb.meta.total:
            out.cu.append(int(mb.meta.total))
        out.rollouts = [rollouts[int(r)] for r in mb.rollouts]
        out.rows = [mb.rollout_rows(tree_forest, i) for i in range(len(mb.rollouts))]
        layouts.append(out)
    return layouts


def _distinct_first_tokens(rng, count, vocab):
    return rng.choice(vocab, size=count, replace=False)


def grpo_forest(rng, groups, n, prompt_len, completion_len, vocab=61):
    """``groups`` prompts (masked), each with ``n`` completions (trained) branching at the
    prompt's last token, their first tokens distinct."""
    lens, parents, leaves, tokens, trained = [], [], [], [], []
    for _ in range(groups):
        root = len(lens)
        length = int(rng.integers(*prompt_len))
        lens.append(length)
        parents.append(-1)
        tokens.append(rng.integers(0, vocab, length))
        trained.append(False)
        for first in _distinct_first_tokens(rng, n, vocab):
            length = int(rng.integers(*completion_len))
            leaves.append(len(lens))
            lens.append(length)
            parents.append(root)
            t = rng.integers(0, vocab, length)
            t[0] = first
            tokens.append(t)
            trained.append(True)
    return Forest(lens, parents, leaves, tokens, trained)


def multiturn_forest(rng, trees, depth, turn_len, vocab=61, max_children=3):
    """Branching multi-turn trees of ``depth`` turns below the root prompt: each turn node is an
    assistant turn (trained) or a tool output (masked), alternating; every node above the last
    level has 1..max_children children with distinct first tokens (at least one node branches
    per tree). Rollouts: every leaf, and every second inner node with children (a rollout that
    ends where others go on)."""
    lens, parents, leaves, tokens, trained = [], [], [], [], []

    def add(parent, level, first):
        node = len(lens)
        length = int(rng.integers(*turn_len))
        t = rng.integers(0, vocab, length)
        if first is not None:
            t[0] = first
        lens.append(length)
        parents.append(parent)
        tokens.append(t)
        trained.append(level % 2 == 1)
        if level == depth:
            leaves.append(node)
            return
        count = int(rng.integers(2 if level == 0 else 1, max_children + 1))
        if level > 0 and node % 2 == 0:
            leaves.append(node)
        for f in _distinct_first_tokens(rng, count, vocab):
            add(node, level + 1, int(f))

    for _ in range(trees):
        add(-1, 0, None)
    return Forest(lens, parents, leaves, tokens, trained)
