#!/usr/bin/env python3
"""A plain-Python k-way Karmarkar-Karp in verl's formulation: the baseline the demo
(demo_cluster.py) and the benchmarks (tests/bench/compare_verl.py) set packsched's plans beside.

Written here, not verl's code, after verl's seqlen balancing (get_seqlen_balanced_partitions /
rearrange_micro_batches): every sequence starts as its own state of k sums (the sequence in one,
zeros elsewhere), and the largest differencing method repeatedly pops the two states with the
largest spread (ties: the larger largest sum) and merges them -- sum i of one with sum k-1-i of
the other -- until one state is left. n states of k sums each, O(n k log k) time and O(n k)
memory; nothing checks a cap. verl takes k = ceil(total / cap).
"""
import heapq


def python_kk(lengths, k):
    """k parts (lists of indices) by the largest differencing method over n states of k sums."""
    heap = []
    for index, length in enumerate(lengths):
        # A state: sums in descending order, and each sum's member list (None while empty).
        sums = [length] + [0] * (k - 1)
        members = [[index]] + [None] * (k - 1)
        # Largest spread first; ties: the larger largest sum; then creation order.
        heapq.heappush(heap, (-(sums[0] - sums[-1]), -sums[0], index, sums, members))
    while len(heap) > 1:
        _, _, tag, sums_a, members_a = heapq.heappop(heap)
        _, _, _, sums_b, members_b = heapq.heappop(heap)
        merged = []
        for i in range(k):
            j = k - 1 - i
            ma, mb = members_a[i], members_b[j]
            if ma is None:
                m = mb
            elif mb is None:
                m = ma
            else:
                m = ma + mb
            merged.append((sums_a[i] + sums_b[j], len(m) if m else 0, m))
        merged.sort(key=lambda s: (s[0], s[1]), reverse=True)
        sums = [s[0] for s in merged]
        members = [s[2] for s in merged]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), -sums[0], tag, sums, members))
    members = heap[0][4]
    return [sorted(m) if m else [] for m in members]
