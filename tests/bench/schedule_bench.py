"""Coordinator-mode schedules compared by step efficiency.

A step lasts sum over slots i of max over ranks r of cost(r, i) when ranks meet at every
micro-batch (FSDP/ZeRO-3, pipeline, context parallelism) and max over ranks of their totals when
they meet once (DDP). Sequence cost c(L) = 24,576 L + L^2; a micro-batch costs alpha + its
sequences' costs (alpha = 2,048 x 24,576), an empty one 0. ideal = (sum c + alpha k_min W) / W
with k_min = ceil(sum L / (W cap)); efficiency = ideal / step.

The peers are this file's own implementations of the real schedulers' rules (read from their
sources; no code copied), each run as the real one runs, micro-batches in its own order (no
peer is re-sorted: the slot a micro-batch lands in is the peer's):
  verl        KK with equal counts over the ranks, then k = max over ranks of
              min(n_r, ceil(tokens / cap)), KK on work into k micro-batches per rank (the cap
              can break), verl's use_dynamic_bsz_balance order;
  verl-retry  our variant: the same, k raised until every micro-batch of every rank fits;
  slime       build_dp_schedule, dynamic batch size with balance_data: first fit in input
              order, bins split to a multiple of W, KK of the bins' model FLOPs over the ranks
              (equal counts), FLOPs as slime's calculate_fwd_flops counts them for the model of
              its scripts/models/qwen3-8B.sh (SLIME_MODEL);
  nemo-rl     sequence packing as every config NeMo-RL ships runs it: its modified first fit
              decreasing packer, bin count raised to a multiple of W, bin b to rank b mod W in
              the packer's order (equal counts).
Their rules are tested in tests/python/test_bench_peers.py. packsched is BalanceBatch through
the in-process planner.

Run: PYTHONPATH=build/python python3 tests/bench/schedule_bench.py [--seeds 10] [--quick]
     [--grid | --timing | --checks]
(--checks --quick --seeds 1 is the small run tests/python/test_bench_peers.py makes.)
"""

import argparse
import bisect
import heapq
import math
import random
import statistics
import time

import numpy as np

from packsched import _planner, planner
from packsched._options import split_options

A, B = 24576, 1
ALPHA = 2048 * 24576


def cost(length):
    return A * length + B * length * length


def rl_mix(rng, n, cap):
    out = []
    for _ in range(n):
        p = min(max(rng.lognormvariate(6.5, 0.6), 200), 2000)
        r = min(max(rng.lognormvariate(7.3, 1.1), 50), 16000)
        out.append(int(min(cap, p + r)))
    return out


def long_mix(rng, n, cap):
    return [int(min(max(rng.lognormvariate(9.0, 1.2), 64), cap)) for _ in range(n)]


def bimodal_mix(rng, n, cap):
    # Many short sequences, a few (5%) near the cap.
    return [
        int(rng.uniform(0.8, 1.0) * cap) if rng.random() < 0.05 else rng.randint(64, 2048)
        for _ in range(n)
    ]


class _Set:
    """One partition of a KK state: its items (position, value) in insertion order and their sum.
    Ordered by (sum, item count, items), as verl's and slime's KK order them."""

    __slots__ = ("items", "sum")

    def __init__(self, items=()):
        self.items = list(items)
        self.sum = sum(v for _, v in self.items)

    def key(self):
        return (self.sum, len(self.items), self.items)


class _State:
    """A KK state: k sets, largest first. The heap pops the largest spread first, then the state
    whose largest set is larger."""

    __slots__ = ("sets",)

    def __init__(self, sets):
        self.sets = sorted(sets, key=_Set.key, reverse=True)

    def spread(self):
        return self.sets[0].sum - self.sets[-1].sum

    def __lt__(self, other):
        if self.spread() != other.spread():
            return self.spread() > other.spread()
        return self.sets[0].key() > other.sets[0].key()


def karmarkar_karp(costs, k, equal_size):
    """k-way largest differencing with verl's (and slime's) rules: items by (value, position);
    with ``equal_size`` each initial state holds k consecutive items, one a set; two states
    merge largest set with smallest. Returns k lists of positions, each ascending, in the final
    state's order (largest sum first), as their get_seqlen_balanced_partitions does."""
    order = sorted((c, i) for i, c in enumerate(costs))
    heap = []
    if equal_size:
        assert len(costs) % k == 0
        for s in range(0, len(order), k):
            heapq.heappush(heap, _State([_Set([(i, c)]) for c, i in order[s : s + k]]))
    else:
        for c, i in order:
            heapq.heappush(heap, _State([_Set([(i, c)])] + [_Set() for _ in range(k - 1)]))
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        merged = [_Set(a.sets[j].items + b.sets[k - 1 - j].items) for j in range(k)]
        heapq.heappush(heap, _State(merged))
    return [sorted(i for i, _ in s.items) for s in heap[0].sets]


def verl(lengths, world, cap, retry):
    """verl: ranks by KK with equal counts on the sequences' work; every rank then runs
    k = max over ranks of min(its sequences, ceil(its tokens / cap)) micro-batches, KK on work
    (the cap can break), ordered as use_dynamic_bsz_balance does: by work (then first index)
    descending, then the even positions reversed followed by the odd ones. ``retry`` (our
    variant, not verl's) raises k until every micro-batch of every rank fits."""
    costs = [cost(x) for x in lengths]
    ranks = karmarkar_karp(costs, world, equal_size=True)
    k = max(min(len(r), math.ceil(sum(lengths[i] for i in r) / cap)) for r in ranks)
    while True:
        grid = []
        for r in ranks:
            parts = [[r[j] for j in p] for p in karmarkar_karp([costs[i] for i in r], k, False)]
            parts.sort(key=lambda p: (sum(costs[i] for i in p), p[0] if p else 0), reverse=True)
            grid.append(parts[::2][::-1] + parts[1::2])
        fits = all(sum(lengths[i] for i in p) <= cap for row in grid for p in row)
        if fits or not retry or k >= min(len(r) for r in ranks):
            return grid
        k += 1


# The model slime's rank balancing counts FLOPs for: slime's scripts/models/qwen3-8B.sh (hidden
# size 4,096, as the 7B dense decoder that c(L) = 24,576 L + L^2 stands for).
SLIME_MODEL = dict(
    num_layers=36,
    hidden_size=4096,
    ffn_hidden_size=12288,
    num_attention_heads=32,
    num_query_groups=8,
    kv_channels=128,
    vocab_size=151936,
)


def slime_flops(length, model=SLIME_MODEL):
    """The forward FLOPs slime estimates for one sample of ``length`` tokens (its
    calculate_fwd_flops, dense model, no multi-latent attention): per layer the Q projection
    (2 L h H d), K and V (2 x 2 L h G d), causal Q K^T (half of 2 H L^2 d), A V (H L^2 d), the
    output projection (2 L h^2) and the gated MLP (3 x 2 L h F); then the LM head (2 L h V).
    h hidden size, H heads, G query groups, d channels per head, F FFN size, V vocabulary."""
    h, heads = model["hidden_size"], model["num_attention_heads"]
    groups, d = model["num_query_groups"], model["kv_channels"]
    n = length
    projections = 2 * n * h * heads * d + 4 * n * h * groups * d + 2 * n * h * h
    attention = heads * n * n * d + heads * n * n * d
    mlp = 6 * n * h * model["ffn_hidden_size"]
    head = 2 * n * h * model["vocab_size"]
    return model["num_layers"] * (projections + attention + mlp) + head


def slime(lengths, world, cap):
    """slime's build_dp_schedule for one step (dynamic batch size, balance_data): first fit in
    input order (a sequence over the cap opens its own bin); the bin count raised to a multiple
    of W (at least W) by splitting the bin with the most tokens (the later one on a tie) into
    two halves, longest sequence first into the lighter half (the first on a tie), the first
    half in place and the second appended; bins to ranks by KK with equal counts on their
    summed ``slime_flops``; each rank runs its bins in ascending bin order."""
    bins, sums = [], []
    for i, length in enumerate(lengths):
        for b in range(len(bins)):
            if sums[b] + length <= cap:
                bins[b].append(i)
                sums[b] += length
                break
        else:
            bins.append([i])
            sums.append(length)
    target = max(-(-len(bins) // world) * world, world)
    while len(bins) < target:
        candidates = [(sum(lengths[i] for i in b), j) for j, b in enumerate(bins) if len(b) > 1]
        if not candidates:
            raise ValueError("slime: every bin holds one sample; cannot reach the count")
        _, j = max(candidates)
        halves, half_sums = [[], []], [0, 0]
        for i in sorted(bins[j], key=lambda i: -lengths[i]):
            h = 0 if half_sums[0] <= half_sums[1] else 1
            halves[h].append(i)
            half_sums[h] += lengths[i]
        bins[j] = halves[0]
        bins.append(halves[1])
    work = [sum(slime_flops(lengths[i]) for i in b) for b in bins]
    ranks = karmarkar_karp(work, world, equal_size=True)
    return [[bins[j] for j in r] for r in ranks]


def modified_ffd(lengths, cap):
    """NeMo-RL's modified first fit decreasing packer (Johnson and Garey's MFFD as its
    nemo_rl/data/packing/algorithms.py runs it): bins of indices, every bin within ``cap`` (no
    length may exceed it). Sizes are large (> cap/2), medium (> cap/3), small (> cap/6) and tiny;
    of equal lengths the lower index counts as the larger.
    1. every large item opens its own bin, largest first;
    2. forward over those bins: each takes the largest medium item that fits, if any;
    3. backward over them: a bin without a medium item where the two smallest small items fit
       takes the smallest and then the largest small item that still fits beside it;
    4. forward over them again: each takes, largest first, every remaining item that fits;
    5. the rest, largest first, each into the least filled of the new bins when it fits there,
       else into a new bin; these bins are kept in order of fill (a grown or new bin after
       those as full) and follow the large items' bins in that order.
    The items of each class are kept as sorted keys, so each "largest that fits" is a bisection
    (NeMo-RL scans; the choices are the same)."""
    n = len(lengths)
    large = sorted((-lengths[i], i) for i in range(n) if 2 * lengths[i] > cap)
    medium = sorted((-lengths[i], i) for i in range(n) if 3 * lengths[i] > cap >= 2 * lengths[i])
    small = sorted((lengths[i], i) for i in range(n) if 6 * lengths[i] > cap >= 3 * lengths[i])
    tiny = [(-lengths[i], i) for i in range(n) if cap >= 6 * lengths[i]]
    bins = [[i] for _, i in large]
    fill = [-size for size, _ in large]
    has_medium = [False] * len(bins)

    def take_largest_fitting(descending, room):
        """Removes and returns the first item of ``descending`` ((-length, index) keys) whose
        length is at most ``room``, or None."""
        at = bisect.bisect_left(descending, (-room, -1))
        return descending.pop(at)[1] if at < len(descending) else None

    for b in range(len(bins)):  # 2
        i = take_largest_fitting(medium, cap - fill[b])
        if i is not None:
            bins[b].append(i)
            fill[b] += lengths[i]
            has_medium[b] = True
    for b in reversed(range(len(bins))):  # 3
        room = cap - fill[b]
        if has_medium[b] or len(small) < 2 or small[0][0] + small[1][0] > room:
            continue
        first = small.pop(0)[1]
        at = bisect.bisect_right(small, (room - lengths[first], n)) - 1
        second = small.pop(at)[1]
        bins[b] += [first, second]
        fill[b] += lengths[first] + lengths[second]
    rest = sorted(medium + [(-size, i) for size, i in small] + tiny)
    for b in range(len(bins)):  # 4
        while rest:
            i = take_largest_fitting(rest, cap - fill[b])
            if i is None:
                break
            bins[b].append(i)
            fill[b] += lengths[i]
    new_bins, new_fill = [[]], [0]  # 5: ordered by fill, least filled first
    for _, i in rest:
        if lengths[i] <= cap - new_fill[0]:
            members, total = new_bins.pop(0), new_fill.pop(0)
        else:
            members, total = [], 0
        members.append(i)
        total += lengths[i]
        at = bisect.bisect_right(new_fill, total)
        new_bins.insert(at, members)
        new_fill.insert(at, total)
    return bins + [b for b in new_bins if b]


def nemo_rl(lengths, world, cap):
    """NeMo-RL's sequence packing as its shipped configs run it (shard_by_batch_size with
    algorithm "modified_first_fit_decreasing" and microbatch_order "packer"): ``modified_ffd``;
    the bin count raised to a multiple of W (at least W) by opening empty bins and giving each
    the last sequence of the bin with the most sequences (the later bin on a tie) that still
    holds two or more; bin b goes to rank b mod W, each rank running its bins in bin order.
    Every rank gets the same count."""
    bins = modified_ffd(lengths, cap)
    target = max(len(bins), world)
    target += -target % world
    sources = sorted(((len(b), j) for j, b in enumerate(bins)), reverse=True)
    source = 0
    for _ in range(len(bins), target):
        while len(bins[sources[source][1]]) < 2:
            source += 1
        bins.append([bins[sources[source][1]].pop()])
    return [[bins[b] for b in range(r, len(bins), world)] for r in range(world)]


def ours(lengths, world, cap, sync):
    batch = planner.balance(
        lengths,
        world,
        cap,
        cost="attention",
        attention_cost=(A, B),
        sync=sync,
        micro_batch_cost=ALPHA,
    )
    grid = []
    for rank in batch.ranks:
        grid.append([[rank.indices[j] for j in mb] for mb in rank.plan.micro_batches])
    return grid, batch.step


def measure(lengths, world, cap, grid):
    """k, micro-batches over the cap and both efficiencies of ``grid`` (rank -> micro-batches in
    the order the rank runs them: slot i is every rank's i-th)."""
    cells = []
    for row in grid:
        cells.append([(ALPHA + sum(cost(lengths[i]) for i in p)) if p else 0 for p in row])
    k = max(len(c) for c in cells)
    cells = [c + [0] * (k - len(c)) for c in cells]
    over = sum(1 for row in grid for p in row if sum(lengths[i] for i in p) > cap)
    total = sum(cost(x) for x in lengths)
    k_min = math.ceil(sum(lengths) / (world * cap))
    ideal = (total + ALPHA * k_min * world) / world
    slot_step = sum(max(c[i] for c in cells) for i in range(k))
    rank_step = max(sum(c) for c in cells)
    return dict(k=k, over=over, eff_mb=ideal / slot_step, eff_step=ideal / rank_step)


INPUTS = [
    ("long-context", long_mix, 32, 16, 65536),
    ("long-context", long_mix, 8, 32, 131072),
    ("RL", rl_mix, 8, 256, 16384),
    ("bimodal", bimodal_mix, 32, 64, 32768),
    ("long-context", long_mix, 128, 8, 65536),
]


# --grid: every mix at W = 8, 32 and 128 (sequences per rank as in INPUTS).
GRID = [
    (name, mix, world, per_rank, cap)
    for name, mix, per_rank, cap in (
        ("RL", rl_mix, 256, 16384),
        ("long-context", long_mix, 16, 65536),
        ("bimodal", bimodal_mix, 64, 32768),
    )
    for world in (8, 32, 128)
]


def timing():
    """n = 65,536 RL-mix sequences over W = 128, cap 16,384, in-process: CPU time of
    planner.balance (median of 3) under both syncs, and of the binding's call alone (the plan
    as dicts, before packsched.plan.Plan objects are made)."""
    lengths = rl_mix(random.Random(0), 65536, 16384)
    cost_options = dict(cost="attention", attention_cost=(A, B))
    kw = dict(cost_options, micro_batch_cost=ALPHA)
    raw_options, _ = split_options(16384, cost_options, where="timing")
    array = np.asarray(lengths, dtype=np.int64)
    for sync in ("step", "micro_batch"):
        full, raw = [], []
        for _ in range(3):
            start = time.process_time()
            batch = planner.balance(lengths, 128, 16384, sync=sync, **kw)
            full.append((time.process_time() - start) * 1e3)
            start = time.process_time()
            _planner.balance(array, 128, raw_options, [], sync, ALPHA)
            raw.append((time.process_time() - start) * 1e3)
        print(
            f"n=65536 RL, W=128, cap 16384, sync={sync}: k={batch.num_micro_batches}, "
            f"efficiency {batch.step.efficiency:.4f}, CPU ms (median of 3): "
            f"planner.balance {statistics.median(full):.1f}, "
            f"_planner.balance {statistics.median(raw):.1f}"
        )


def pareto_mix(rng, n, cap, shape):
    return [int(min(cap, 1024 * rng.paretovariate(shape))) for _ in range(n)]


def row_greedy(lengths, world, cap):
    """Slot rows filled one after the other, longest first, each sequence to the row's cheapest
    micro-batch within the cap (a new row when none takes it): a grid as the peers give one."""
    rows = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = rows[-1] if rows else None
        fits = [r for r in range(world) if row and row[r][1] + lengths[i] <= cap]
        if not fits:
            row = [[0, 0, []] for _ in range(world)]  # [cost, tokens, indices] per micro-batch
            rows.append(row)
            fits = list(range(world))
        r = min(fits, key=lambda r: (row[r][0], r))
        row[r][0] += cost(lengths[i]) + (ALPHA if not row[r][2] else 0)
        row[r][1] += lengths[i]
        row[r][2].append(i)
    return [[row[r][2] for row in rows] for r in range(world)]


CHECK_INPUTS = [
    ("long-context", long_mix, 16, 65536),
    ("bimodal", bimodal_mix, 64, 32768),
    ("long-context", long_mix, 32, 131072),
    ("RL", rl_mix, 64, 16384),
]


def checks(seeds, quick=False):
    """packsched against the best capped peer under sync step, and against the row greedy under
    sync micro_batch on Pareto lengths: how many inputs trail by more than 0.002, and by how much
    at most. ``quick``: W = 8 only, the first two inputs, two Pareto shapes and one per-rank
    count (a smoke run for the test suite). Returns the two (behind, count) pairs."""
    results = []
    behind, worst, count = 0, 0.0, 0
    for name, mix, per_rank, cap in CHECK_INPUTS[:2] if quick else CHECK_INPUTS:
        for world in (8,) if quick else (8, 32):
            for seed in range(seeds):
                lengths = mix(random.Random(seed), world * per_rank, cap)
                ours = measure(lengths, world, cap, ours_grid(lengths, world, cap, "step"))
                peers = (
                    verl(lengths, world, cap, retry=True),
                    slime(lengths, world, cap),
                    nemo_rl(lengths, world, cap),
                )
                best = max(measure(lengths, world, cap, g)["eff_step"] for g in peers)
                gap = best - ours["eff_step"]
                behind += gap > 0.002
                worst = max(worst, gap)
                count += 1
    print(
        f"sync=step: {behind} of {count} inputs more than 0.002 behind the best capped peer "
        f"(at most {worst:+.4f})"
    )
    results.append((behind, count))
    behind, worst, count = 0, 0.0, 0
    for shape in (1.1, 2.0) if quick else (1.1, 1.3, 1.5, 2.0, 2.5):
        for per_rank in (32,) if quick else (32, 64, 128, 256):
            for seed in range(seeds // 2 or 1):
                rng = random.Random(seed * 7919 + per_rank)
                lengths = pareto_mix(rng, 8 * per_rank, 131072, shape)
                ours = measure(lengths, 8, 131072, ours_grid(lengths, 8, 131072, "micro_batch"))
                rows = measure(lengths, 8, 131072, row_greedy(lengths, 8, 131072))
                gap = rows["eff_mb"] - ours["eff_mb"]
                behind += gap > 0.002
                worst = max(worst, gap)
                count += 1
    print(
        f"sync=micro_batch, Pareto lengths, W = 8, cap 131072: {behind} of {count} inputs more "
        f"than 0.002 behind the row greedy (at most {worst:+.4f})"
    )
    results.append((behind, count))
    return results


def ours_grid(lengths, world, cap, sync):
    grid, _ = ours(lengths, world, cap, sync)
    return grid


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--quick", action="store_true", help="the first three inputs only (--checks: a few)"
    )
    parser.add_argument("--timing", action="store_true", help="the n = 65,536 timing only")
    parser.add_argument("--grid", action="store_true", help="every mix at W = 8, 32 and 128")
    parser.add_argument(
        "--checks", action="store_true", help="sync=step against the peers, and the row greedy"
    )
    args = parser.parse_args()
    if args.checks:
        checks(args.seeds, args.quick)
        return
    if args.timing:
        timing()
        return
    inputs = GRID if args.grid else INPUTS[:3] if args.quick else INPUTS
    print(
        "| input | schedule | k | over cap | eff (sync micro_batch) | eff (sync step) "
        "| plan ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, mix, world, per_rank, cap in inputs:
        rows = {}
        bounds = []
        for seed in range(args.seeds):
            lengths = mix(random.Random(seed), world * per_rank, cap)
            runs = {
                "verl": lambda: verl(lengths, world, cap, retry=False),
                "verl-retry": lambda: verl(lengths, world, cap, retry=True),
                "slime": lambda: slime(lengths, world, cap),
                "nemo-rl": lambda: nemo_rl(lengths, world, cap),
            }
            for label, fn in runs.items():
                start = time.process_time()
                grid = fn()
                ms = (time.process_time() - start) * 1e3
                rows.setdefault(label, []).append(dict(measure(lengths, world, cap, grid), ms=ms))
            for sync in ("step", "micro_batch"):
                start = time.process_time()
                grid, step = ours(lengths, world, cap, sync)
                ms = (time.process_time() - start) * 1e3
                m = dict(measure(lengths, world, cap, grid), ms=ms)
                rows.setdefault(f"packsched sync={sync}", []).append(m)
                if sync == "micro_batch":
                    bounds.append(step.lower_bound_efficiency)
        label_input = f"{name}, W={world}x{per_rank}, cap {cap}"
        for label, ms in rows.items():
            mean = lambda key: statistics.mean(m[key] for m in ms)  # noqa: E731
            print(
                f"| {label_input} | {label} | {mean('k'):.1f} | {mean('over'):.1f} "
                f"| {mean('eff_mb'):.3f} | {mean('eff_step'):.3f} | {mean('ms'):.1f} |"
            )
        print(
            f"| {label_input} | lower bound (packsched's) | | | "
            f"{statistics.mean(bounds):.3f} | | |"
        )


if __name__ == "__main__":
    main()
