"""Adversarial request shapes for the sidecar's memory estimate (docs/design.md §3, memory per
request): small requests that make large plans. Shared by tests/python/test_memory_guarantee.py
and tests/bench/forest_memory_bench.py. Each shape is (name, method, request)."""

import numpy as np

from packsched.v1 import scheduler_pb2 as pb

ISOLATE = pb.OVERLONG_POLICY_ISOLATE


def forest(node_len, node_parent, rollout_leaf):
    f = pb.Forest()
    f.node_len.extend(np.asarray(node_len).tolist())
    f.node_parent.extend(np.asarray(node_parent).tolist())
    f.rollout_leaf.extend(np.asarray(rollout_leaf).tolist())
    return f


def trunk(nodes, node_len):
    """A chain of `nodes` nodes with a rollout ending at every node: rollout i is the first i + 1
    nodes, so a cap below the chain isolates the deep ones, each repeating the trunk above it."""
    return forest(np.full(nodes, node_len), np.arange(nodes) - 1, np.arange(nodes))


def comb(nodes, side_len):
    """A trunk of one-token nodes with a rollout through a side leaf of `side_len` tokens at
    every trunk node: pieces under a cap repeat the trunk above their leaves."""
    node_len = np.ones(2 * nodes, dtype=np.int64)
    parent = np.empty(2 * nodes, dtype=np.int64)
    # Node 2i is trunk node i, node 2i + 1 its side leaf.
    parent[0::2] = np.arange(nodes) * 2 - 2
    parent[0] = -1
    parent[1::2] = np.arange(nodes) * 2
    node_len[1::2] = side_len
    return forest(node_len, parent, np.arange(nodes) * 2 + 1)


def fan_out(leaves):
    """One one-token root with `leaves` one-token children, a rollout each."""
    return forest(
        np.ones(leaves + 1, dtype=np.int64),
        np.r_[-1, np.zeros(leaves, dtype=np.int64)],
        np.arange(1, leaves + 1),
    )


def options(cap, **kw):
    return pb.PlanOptions(max_token_len=cap, overlong=ISOLATE, **kw)


def plan(f=None, cap=4096, lengths=None, **kw):
    r = pb.PlanRequest(stream="memory", round=1, options=options(cap, **kw))
    if f is not None:
        r.forest.CopyFrom(f)
    else:
        r.lengths.extend(lengths)
    return r


def shapes(rng):
    """The shapes of the memory guarantee's test, smallest first within each kind."""
    realistic = np.clip(rng.lognormal(7.0, 1.0, 200_000), 1, 30_000).astype(np.int64).tolist()
    out = [
        # Deep trunks, a rollout at every node: the isolated rollouts repeat the trunk.
        ("trunk 3,000 x 5 tokens, cap 4,096", "Plan", plan(trunk(3000, 5), 4096)),
        ("trunk 3,000 x 1 token, cap 1,000", "Plan", plan(trunk(3000, 1), 1000)),
        ("trunk 12,000 x 1 token, cap 1,000", "Plan", plan(trunk(12_000, 1), 1000)),
        ("comb 4,000 + leaves of 2,000, cap 8,192", "Plan", plan(comb(4000, 2000), 8192)),
        ("comb 3,000 + leaves of 4,097, cap 8,192", "Plan", plan(comb(3000, 4097), 8192)),
        # Huge fan-out at a tiny cap: one micro-batch per leaf.
        ("fan-out 100,000 leaves, cap 2", "Plan", plan(fan_out(100_000), 2)),
        ("fan-out 440,000 leaves, cap 2", "Plan", plan(fan_out(440_000), 2)),
        # A long chain: one rollout, and a rollout at every node.
        (
            "chain 60,000 x 1 token, one rollout",
            "Plan",
            plan(forest(np.ones(60_000, dtype=np.int64), np.arange(60_000) - 1, [59_999]), 65_536),
        ),
        ("chain 60,000 x 1 token, every node", "Plan", plan(trunk(60_000, 1), 8192)),
        # Flat shapes of the earlier probes.
        (
            "flat n = 2, min_micro_batches = 1,000,000",
            "Plan",
            plan(lengths=[100, 200], cap=4096, min_micro_batches=1_000_000),
        ),
        ("flat n = 200,000 realistic, cap 32,768", "Plan", plan(lengths=realistic, cap=32_768)),
    ]
    partition = pb.PartitionRequest(num_micro_batches=440_000, options=options(2))
    partition.forest.CopyFrom(fan_out(440_000))
    out.append(("Partition fan-out 440,000 leaves, k = 440,000", "Partition", partition))
    balance = pb.BalanceBatchRequest(world_size=8, options=options(1000))
    balance.forest.CopyFrom(trunk(3000, 1))
    out.append(("BalanceBatch trunk 3,000 x 1 token, cap 1,000, W = 8", "BalanceBatch", balance))
    balance = pb.BalanceBatchRequest(world_size=8, options=options(2))
    balance.forest.CopyFrom(fan_out(100_000))
    out.append(("BalanceBatch fan-out 100,000, cap 2, W = 8", "BalanceBatch", balance))
    # group_ids, a group a rollout: every node of the trunk copied once per rollout below it.
    balance = pb.BalanceBatchRequest(world_size=8, options=options(2000))
    balance.forest.CopyFrom(trunk(1500, 1))
    balance.group_ids.extend(range(1500))
    out.append(
        ("BalanceBatch trunk 1,500 x 1 token, a group a rollout, W = 8", "BalanceBatch", balance)
    )
    return out
