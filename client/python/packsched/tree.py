"""Forests of rollouts for tree packing (docs/design.md "Tree packing").

Rollouts that share a prefix (a GRPO group's prompt, an agent's earlier turns) are paths of one
tree, so a shared token is forwarded once. A ``Forest`` is three flat int64 arrays, the same the
C++ planner (server/planner/forest.h), the CLI and the sidecar take:

    node_len[N]      tokens of node n (>= 1)
    node_parent[N]   -1 for a root, else its parent, which comes before it (node_parent[n] < n)
    rollout_leaf[R]  rollout r is the path from its tree's root down to node rollout_leaf[r]

A token's position is its depth: the tokens before it on its root path (its index in every
rollout through it). ``build_forest`` makes a forest from token ids, ``forest_from_groups`` from
lengths alone (prompt + n completions per group). The plan over a forest is ``plan_local``,
``partition`` and ``balance`` of ``packsched.planner`` given a Forest (a ``TreePlan``, below).
"""

from dataclasses import dataclass, field

import numpy as np

from ._inputs import int_array

__all__ = [
    "Forest",
    "build_forest",
    "forest_from_groups",
    "TreeMicroBatch",
    "TreePlan",
]

_MAX_LENGTH = (1 << 31) - 1


def _int64(values, what):
    # The client's and the planner's one check and messages (packsched._inputs).
    return int_array(values, what, allow_empty=True)


@dataclass(frozen=True, eq=False)
class Forest:
    """A forest of rollouts (see the module docstring). ``node_tokens``: optional, the token ids
    of every node one after another (node n's are ``node_tokens[node_start[n]:][:node_len[n]]``),
    kept by ``build_forest`` so that packed input ids can be made from the forest alone.
    Validated on construction: ValueError naming the node or rollout."""

    node_len: np.ndarray
    node_parent: np.ndarray
    rollout_leaf: np.ndarray
    node_tokens: np.ndarray = None
    depth: np.ndarray = field(init=False, repr=False)  # tokens above each node
    rollout_len: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        node_len = _int64(self.node_len, "node_len")
        parent = _int64(self.node_parent, "node_parent")
        leaf = _int64(self.rollout_leaf, "rollout_leaf")
        object.__setattr__(self, "node_len", node_len)
        object.__setattr__(self, "node_parent", parent)
        object.__setattr__(self, "rollout_leaf", leaf)
        n = len(node_len)
        if len(parent) != n:
            raise ValueError(f"forest: node_parent has {len(parent)} entries for {n} nodes")
        bad = np.flatnonzero((node_len < 1) | (node_len > _MAX_LENGTH))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"forest: node {i} has node_len = {node_len[i]}: must be in [1, {_MAX_LENGTH}]"
            )
        bad = np.flatnonzero((parent < -1) | (parent >= np.arange(n)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"forest: node {i} has node_parent = {parent[i]}: must be -1 (a root) or a node "
                f"before it, in [0, {i}) (parents come before their children, which also rules "
                "out a cycle)"
            )
        depth = np.zeros(n, dtype=np.int64)
        for i in np.flatnonzero(parent >= 0):  # parents first: one pass
            depth[i] = depth[parent[i]] + node_len[parent[i]]
        over = np.flatnonzero(depth + node_len > _MAX_LENGTH)
        if over.size:
            i = int(over[0])
            raise ValueError(f"forest: the path to node {i} holds over {_MAX_LENGTH} tokens")
        bad = np.flatnonzero((leaf < 0) | (leaf >= n))
        if bad.size:
            r = int(bad[0])
            raise ValueError(
                f"forest: rollout {r} has rollout_leaf = {leaf[r]}: must be a node in [0, {n})"
            )
        used = np.zeros(n, dtype=bool)
        used[leaf] = True
        for i in range(n - 1, -1, -1):  # children after parents: a reverse pass marks paths
            if used[i] and parent[i] >= 0:
                used[parent[i]] = True
        unused = np.flatnonzero(~used)
        if unused.size:
            raise ValueError(
                f"forest: node {int(unused[0])} is on no rollout's path (every node must be some "
                "rollout's)"
            )
        if self.node_tokens is not None:
            tokens = _int64(self.node_tokens, "node_tokens")
            if len(tokens) != int(node_len.sum()):
                raise ValueError(
                    f"forest: node_tokens has {len(tokens)} entries for {int(node_len.sum())} "
                    "node tokens"
                )
            object.__setattr__(self, "node_tokens", tokens)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "rollout_len", depth[leaf] + node_len[leaf] if n else leaf)

    @property
    def num_nodes(self):
        return len(self.node_len)

    @property
    def num_rollouts(self):
        return len(self.rollout_leaf)

    @property
    def unique_tokens(self):
        """Every token once: what tree packing forwards when no tree is split."""
        return int(self.node_len.sum())

    @property
    def rollout_tokens(self):
        """Every rollout's tokens: what flat packing forwards."""
        return int(self.rollout_len.sum())

    @property
    def node_start(self):
        """Where each node's tokens start in ``node_tokens``."""
        return np.concatenate(([0], np.cumsum(self.node_len)[:-1])).astype(np.int64)

    def path(self, r):
        """The nodes of rollout ``r``, root first."""
        nodes = []
        node = int(self.rollout_leaf[r])
        while node >= 0:
            nodes.append(node)
            node = int(self.node_parent[node])
        return nodes[::-1]

    def rollout_token_ids(self, r):
        """Rollout ``r``'s token ids (needs ``node_tokens``)."""
        if self.node_tokens is None:
            raise ValueError("forest: no node_tokens (build the forest with build_forest)")
        start = self.node_start
        return np.concatenate(
            [self.node_tokens[start[n] : start[n] + self.node_len[n]] for n in self.path(r)]
        )

    def check_rollouts(self, rollouts):
        """ValueError naming the first rollout whose tokens are not its path's (needs
        ``node_tokens``): that the forest describes the rollouts the caller holds."""
        if len(rollouts) != self.num_rollouts:
            raise ValueError(
                f"forest: {len(rollouts)} rollouts given for {self.num_rollouts} in the forest"
            )
        for r, tokens in enumerate(rollouts):
            want = self.rollout_token_ids(r)
            got = _int64(tokens, f"rollouts[{r}]")
            if len(got) != len(want) or not np.array_equal(got, want):
                raise ValueError(
                    f"forest: rollout {r}'s tokens do not match its path to node "
                    f"{int(self.rollout_leaf[r])} ({len(got)} tokens given, {len(want)} on it)"
                )

    def forwarded_lower_bound(self, max_token_len, align_to=1, overlong="isolate"):
        """The fewest tokens any plan of this forest can forward under the cap: a floor to
        judge a plan's ``forwarded_tokens`` by (a bound, not always reachable).

        A piece holds at most ``room`` tokens (the largest multiple of ``align_to`` within
        ``max_token_len``), each token of node u is forwarded once per piece that holds u, and
        every piece holding a node below u holds u's whole path of ``through(u)`` tokens. So
        the pieces holding u number at least: 1; ceil(tokens below u / (room - through(u)));
        the count for any child; and the children of u through which some rollout has more
        than (room - through(u)) / 2 tokens below u (no two of those fit in one piece). The
        bound is the sum over nodes of their tokens times that count. Rollouts whose aligned
        length passes the cap are forwarded alone (``overlong="isolate"``: their tokens are
        added) or not at all (``"drop"``), as the planner treats them."""
        if overlong not in ("isolate", "drop"):
            raise ValueError(f"overlong = {overlong!r}: must be 'isolate' or 'drop'")
        if max_token_len < 1 or align_to < 1:
            raise ValueError("max_token_len and align_to must be >= 1")
        room = max_token_len // align_to * align_to
        over = self.rollout_len > room
        bound = int(self.rollout_len[over].sum()) if overlong == "isolate" else 0
        n = self.num_nodes
        parent = self.node_parent
        node_len = self.node_len
        # Per node: kept tokens of its subtree, and the longest kept rollout path through it.
        sub = np.zeros(n, dtype=np.int64)
        longest = np.zeros(n, dtype=np.int64)
        kept_leaf = self.rollout_leaf[~over]
        np.maximum.at(longest, kept_leaf, self.rollout_len[~over])
        used = np.zeros(n, dtype=bool)
        used[kept_leaf] = True
        for i in range(n - 1, -1, -1):  # children after parents: a reverse pass
            if not used[i]:
                continue
            sub[i] += node_len[i]
            if parent[i] >= 0:
                used[parent[i]] = True
                sub[parent[i]] += sub[i]
                longest[parent[i]] = max(longest[parent[i]], longest[i])
        through = self.depth + node_len
        pieces = np.ones(n, dtype=np.int64)
        wide = np.zeros(n, dtype=np.int64)  # children with a rollout over half the free room
        for i in range(n - 1, -1, -1):
            if not used[i]:
                continue
            free = room - through[i]
            below = sub[i] - node_len[i]
            if below > 0:  # a kept rollout below i fits the cap, so free >= its tokens > 0
                pieces[i] = max(pieces[i], -(-below // free), wide[i])
            p = parent[i]
            if p >= 0:
                pieces[p] = max(pieces[p], pieces[i])
                if 2 * (longest[i] - through[p]) > room - through[p]:
                    wide[p] += 1
        return bound + int((node_len * pieces)[used].sum())

    def to_json(self):
        """The forest as the CLI's tree JSON (see client/README.md): plain lists."""
        out = {
            "node_len": self.node_len.tolist(),
            "node_parent": self.node_parent.tolist(),
            "rollout_leaf": self.rollout_leaf.tolist(),
        }
        return out


def forest_from_groups(prompt_lens, completion_lens_per_group):
    """The GRPO forest from lengths alone: per group g one root of ``prompt_lens[g]`` tokens and
    one child per completion of ``completion_lens_per_group[g]`` (a completion of 0 tokens is a
    rollout of the prompt alone). Rollouts are numbered group after group."""
    prompts = _int64(prompt_lens, "prompt_lens")
    if len(prompts) != len(completion_lens_per_group):
        raise ValueError(
            f"{len(prompts)} prompts for {len(completion_lens_per_group)} completion groups"
        )
    node_len, parent, leaf = [], [], []
    for g, prompt in enumerate(prompts.tolist()):
        root = len(node_len)
        node_len.append(prompt)
        parent.append(-1)
        for c in _int64(completion_lens_per_group[g], f"completion_lens_per_group[{g}]").tolist():
            if c < 0:
                raise ValueError(f"group {g}: a completion of {c} tokens")
            if c == 0:
                leaf.append(root)
                continue
            node_len.append(c)
            parent.append(root)
            leaf.append(len(node_len) - 1)
    return Forest(np.array(node_len), np.array(parent), np.array(leaf))


def build_forest(rollouts, group_ids=None):
    """A trie per group over exact token ids: rollouts of one group that start with the same
    tokens share those nodes, each node a maximal shared run. ``rollouts``: sequences of token
    ids (lists, numpy arrays or tensors), each at least one token; ``group_ids``: one per rollout
    (rollouts of different groups never share a node), default one group. Nodes are numbered in
    depth-first preorder (groups by first appearance, siblings in token order); deterministic;
    O(total tokens) besides the sort of each group. -> Forest with node_tokens"""
    seqs = [_int64(r, f"rollouts[{i}]") for i, r in enumerate(rollouts)]
    for i, s in enumerate(seqs):
        if len(s) == 0:
            raise ValueError(f"rollout {i} has no tokens")
    if group_ids is None:
        group_ids = [0] * len(seqs)
    if len(group_ids) != len(seqs):
        raise ValueError(f"group_ids has {len(group_ids)} entries for {len(seqs)} rollouts")
    groups = {}
    for i, g in enumerate(np.asarray(group_ids).tolist()):
        groups.setdefault(g, []).append(i)

    # Built with provisional ids, then renumbered in preorder. A node: [rollout, start, end) of
    # one rollout through it, its parent and children (in token order).
    start, end, owner, parent, children = [], [], [], [], []
    leaf_of = [0] * len(seqs)
    roots = []

    def new_node(r, a, b, p):
        start.append(a)
        end.append(b)
        owner.append(r)
        parent.append(p)
        children.append([])
        (children[p] if p >= 0 else roots).append(len(start) - 1)
        return len(start) - 1

    for members in groups.values():
        order = sorted(members, key=lambda i: (seqs[i].tolist(), i))
        path = []  # nodes of the previous rollout, root first
        prev = None
        for i in order:
            s = seqs[i]
            lcp = 0
            if prev is not None:
                m = min(len(s), len(prev))
                diff = np.flatnonzero(s[:m] != prev[:m])
                lcp = int(diff[0]) if diff.size else m
            # Keep the nodes that start before lcp; split the last one if it ends after it.
            while path and start[path[-1]] >= lcp:
                path.pop()
            if path and end[path[-1]] > lcp:
                # The upper part becomes a new node u in x's place; x keeps its lower part, its
                # children and the rollouts that end in it.
                x = path[-1]
                px = parent[x]
                siblings = children[px] if px >= 0 else roots
                u = len(start)
                start.append(start[x])
                end.append(lcp)
                owner.append(owner[x])
                parent.append(px)
                children.append([x])
                siblings[-1] = u  # x: the last child (the previous rollout's path, sorted)
                parent[x] = u
                start[x] = lcp
                path[-1] = u
            if lcp == len(s):  # a duplicate of the previous rollout
                leaf_of[i] = path[-1]
            else:
                leaf_of[i] = new_node(i, lcp, len(s), path[-1] if path else -1)
                path.append(leaf_of[i])
            prev = s

    # Preorder renumbering: roots in creation order (groups by first appearance, token order
    # within one), children in token order (creation order of a sorted group).
    new_id = [0] * len(start)
    order = []
    stack = roots[::-1]
    while stack:
        node = stack.pop()
        new_id[node] = len(order)
        order.append(node)
        stack.extend(children[node][::-1])
    node_len = np.array([end[n] - start[n] for n in order], dtype=np.int64)
    node_parent = np.array([-1 if parent[n] < 0 else new_id[parent[n]] for n in order], np.int64)
    tokens = [seqs[owner[n]][start[n] : end[n]] for n in order]
    node_tokens = np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int64)
    leaf = np.array([new_id[n] for n in leaf_of], dtype=np.int64)
    return Forest(node_len, node_parent, leaf, node_tokens)


@dataclass(frozen=True, eq=False)
class TreeMicroBatch:
    """One tree-packed micro-batch (docs/design.md "Tree packing"). ``meta``: its MicroBatchMeta
    as for sequences, over pieces (``meta.indices``: piece ids; ``cu_seqlens`` /
    ``cu_seqlens_aligned`` delimit the pieces, the varlen kernels' sequences). The layout as the
    plan keeps it, linear in its pieces and rollouts:

        rollouts                          held rollouts, ascending
        piece_rollouts, piece_rollout_begin   piece b holds piece_rollouts[begin[b]:begin[b + 1]]
                                          and every node on their paths

    ``forest``: the forest planned. Its entries (the nodes of its pieces, piece after piece,
    each in depth-first preorder) are computed from it on first use, by the planner's own
    function (``planner::Entries``, through the binding), and kept:

        nodes, row, position, subtree_end, parent   per entry (int64 arrays)
        piece_begin                                  [P + 1] piece b's entries
        rollout_entry                                per held rollout, its last entry

    Row t of entry e has position ``position[e] + t - row[e]`` and subtree_end
    ``subtree_end[e]``; ``rows()`` expands them over the ``meta.total`` packed rows."""

    meta: object
    rollouts: np.ndarray
    piece_rollouts: np.ndarray
    piece_rollout_begin: np.ndarray
    forest: Forest = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def _forest(self, forest):
        forest = self.forest if forest is None else forest
        if forest is None:
            raise ValueError("tree layout: no forest (give the forest that was planned)")
        return forest

    def _layout_args(self):
        return (
            np.asarray(self.rollouts, dtype=np.int64),
            np.asarray(self.piece_rollouts, dtype=np.int64),
            np.asarray(self.piece_rollout_begin, dtype=np.int64),
        )

    def entries(self, forest=None):
        """The entries as a dict of int64 arrays (``nodes`` ... ``rollout_entry``), computed
        once per forest."""
        forest = self._forest(forest)
        key = ("entries", id(forest))
        if key not in self._cache:
            from . import _planner

            self._cache.clear()
            self._cache[key] = _planner.tree_entries(
                forest.node_len,
                forest.node_parent,
                forest.rollout_leaf,
                list(self.meta.cu_seqlens_aligned),
                *self._layout_args(),
            )
            self._cache["forest"] = forest  # keeps id(forest) from being reused
        return self._cache[key]

    def __getattr__(self, name):
        from ._options import SCHEMA

        if name in SCHEMA["tree_entries"]:
            return self.entries()[name]
        raise AttributeError(name)

    def rows(self, forest=None):
        """(position, subtree_end): int32 arrays over the ``meta.total`` packed rows. A piece's
        alignment padding counts positions 0, 1, ... and ends at the piece's aligned end; the
        tail past the aligned tokens counts from 0 and ends at ``total``: no real row sees a
        padding row, or the reverse."""
        from . import _planner

        forest = self._forest(forest)
        return _planner.tree_rows(
            forest.node_len,
            forest.node_parent,
            forest.rollout_leaf,
            list(self.meta.cu_seqlens),
            list(self.meta.cu_seqlens_aligned),
            int(self.meta.aligned_tokens),
            int(self.meta.total),
            *self._layout_args(),
        )

    def rollout_rows(self, forest=None, i=0):
        """The packed rows of ``rollouts[i]`` in its token order: its restore indices (the rows
        of the entries from ``rollout_entry[i]`` up through ``parent``, root first), by the
        planner's own function (``planner::RolloutRows``), every held rollout's computed once
        per forest and kept."""
        forest = self._forest(forest)
        key = ("rollout_rows", id(forest))
        if key not in self._cache:
            from . import _planner

            self.entries(forest)  # the cache is per forest: entries first, then these beside
            self._cache[key] = _planner.tree_rollout_rows(
                forest.node_len,
                forest.node_parent,
                forest.rollout_leaf,
                list(self.meta.cu_seqlens_aligned),
                *self._layout_args(),
            )
        rows, offsets = self._cache[key]
        i = range(len(offsets) - 1)[i]  # IndexError past the held rollouts, as a list's
        return rows[offsets[i] : offsets[i + 1]].copy()

    def input_ids(self, forest=None, pad=0):
        """The packed token ids [total] (needs ``forest.node_tokens``); padding holds ``pad``."""
        forest = self._forest(forest)
        if forest.node_tokens is None:
            raise ValueError("forest: no node_tokens (build the forest with build_forest)")
        e = self.entries(forest)
        lens = forest.node_len[e["nodes"]]
        offsets = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(lens) - lens, lens
        )
        out = np.full(self.meta.total, pad, dtype=np.int64)
        out[np.repeat(e["row"], lens) + offsets] = forest.node_tokens[
            np.repeat(forest.node_start[e["nodes"]], lens) + offsets
        ]
        return out


@dataclass(frozen=True, eq=False)
class TreePlan:
    """A plan over a forest. ``micro_batches``: TreeMicroBatch per micro-batch; ``rollout_part``:
    each rollout's micro-batch (-1 if dropped, or on another rank in a balanced plan);
    ``dropped``: rollouts left out (overlong="drop"); ``loss_weights`` per rollout and
    ``loss_scales`` per micro-batch as for sequences (with ``loss_tokens``, one per rollout);
    ``forwarded_tokens``: the rows of real tokens the plan forwards; ``rollout_tokens``: what flat
    packing of the same rollouts forwards; ``stats``: the planner's, over pieces."""

    num_micro_batches: int
    local_num_micro_batches: int
    micro_batches: list
    rollout_part: np.ndarray
    dropped: list
    forwarded_tokens: int
    rollout_tokens: int
    stats: object
    loss_weights: list = None
    loss_scales: list = None
    global_counts: tuple = None

    @classmethod
    def from_raw(cls, raw, *, forest=None, cap=0, local_k=None, global_counts=None):
        from ._options import SCHEMA
        from .plan import PlanStats, meta_of, _LOCAL_K, _LOSS_SCALE

        scales = raw.get("loss_scales")
        parts = []
        for i, p in enumerate(raw["parts"]):
            meta = meta_of({**p["batch"], _LOSS_SCALE: None if scales is None else scales[i]})
            arrays = {k: np.asarray(v, dtype=np.int64) for k, v in p.items() if k != "batch"}
            parts.append(TreeMicroBatch(meta, **arrays, forest=forest))
        stats = PlanStats(**raw["stats"], cap=cap or 0)
        figures = {}  # the tree table's rows but the layouts (the parts')
        for f in SCHEMA["tree_plan"]:
            if f["kind"] == "Ints":
                figures[f["name"]] = np.asarray(raw[f["name"]], dtype=np.int64)
            elif f["kind"] != "Layouts":
                figures[f["name"]] = raw[f["name"]]
        return cls(
            **figures,
            num_micro_batches=len(parts),
            local_num_micro_batches=getattr(stats, _LOCAL_K) if local_k is None else local_k,
            micro_batches=parts,
            dropped=list(raw["dropped"]),
            stats=stats,
            loss_weights=raw.get("loss_weights"),
            loss_scales=scales,
            global_counts=global_counts or raw.get("loss_counts"),
        )

    @classmethod
    def from_plan(cls, plan, layouts, rollout_part, forwarded_tokens, rollout_tokens, forest=None):
        """A TreePlan from the sidecar's answer: ``plan`` (a packsched.plan.Plan over pieces and
        rollouts), one dict of lists per micro-batch (the TreeLayout fields), the tree's
        figures and the forest that was planned."""
        parts = [
            TreeMicroBatch(
                meta,
                **{k: np.asarray(v, dtype=np.int64) for k, v in layout.items()},
                forest=forest,
            )
            for meta, layout in zip(plan.metadata, layouts)
        ]
        return cls(
            num_micro_batches=plan.num_micro_batches,
            local_num_micro_batches=plan.local_num_micro_batches,
            micro_batches=parts,
            rollout_part=np.asarray(rollout_part, dtype=np.int64),
            dropped=list(plan.dropped),
            forwarded_tokens=forwarded_tokens,
            rollout_tokens=rollout_tokens,
            stats=plan.stats,
            loss_weights=plan.loss_weights,
            loss_scales=plan.loss_scales,
            global_counts=plan.global_counts,
        )

    @property
    def tokens(self):
        """The plan's TokenAccounting (logical: the rollouts' own tokens; forwarded: the pieces'
        tokens; ``tokens.tree_token_ratio`` the tree token ratio)."""
        from .plan import TokenAccounting

        return TokenAccounting(
            self.rollout_tokens,
            self.stats.packed_tokens,
            self.forwarded_tokens,
            self.stats.loss_tokens,
        )

    def restore(self, forest, outputs, fill=None):
        """Per-rollout outputs from per-micro-batch packed outputs: ``outputs[i]`` has
        ``micro_batches[i].meta.total`` rows (numpy arrays or torch tensors, rows on dim 0);
        rollout r gets its rows (``rollout_rows``) in its token order. Returns a list of R
        pieces; dropped rollouts (and those on other ranks) get ``fill`` (default None)."""
        if len(outputs) != len(self.micro_batches):
            raise ValueError(
                f"restore: got {len(outputs)} outputs for {len(self.micro_batches)} micro-batches"
            )
        out = [fill] * forest.num_rollouts
        for part, packed in zip(self.micro_batches, outputs):
            if len(packed) != part.meta.total:
                raise ValueError(
                    f"restore: an output has {len(packed)} rows, expected {part.meta.total}"
                )
            for i, r in enumerate(part.rollouts.tolist()):
                rows = part.rollout_rows(forest, i)
                if type(packed).__module__.startswith("torch"):
                    import torch

                    out[r] = packed.index_select(
                        0, torch.as_tensor(rows, dtype=torch.long, device=packed.device)
                    )
                else:
                    out[r] = np.asarray(packed)[rows]
        return out
