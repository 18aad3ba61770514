"""Coordinator-mode schedules compared by step efficiency.

A step lasts sum over slots i of max over ranks r of cost(r, i) when ranks meet at every
micro-batch (FSDP/ZeRO-3, pipeline, context parallelism) and max over ranks of their totals when
they meet once (DDP). Sequence cost c(L) = 24,576 L + L^2; a micro-batch costs alpha + its
sequences' costs (alpha = 2,048 x 24,576), an empty one 0. ideal = (sum c + alpha k_min W) / W
with k_min = ceil(sum L / (W cap)); efficiency = ideal / step.

The peers are this file's own implementations of their published algorithms (no code copied):
  verl        KK with equal counts over the ranks, then k = max over ranks of ceil(tokens / cap),
              KK on cost into k micro-batches per rank (the cap can break);
  verl-retry  the same, k raised until every micro-batch of every rank fits;
  slime       first fit under the cap over the global batch, bins padded to a multiple of W by
              halving the largest bin, KK of bin costs over the ranks (equal bin counts);
  nemo-rl     first fit decreasing under the cap over the global batch into at least W bins
              (W open at the start), the bins dealt to the ranks by cost, round robin (our
              reading of NeMo-RL's modified first fit decreasing packer with a minimum bin count).
Each peer's micro-batches are put in cost-descending order on every rank (their best slot
alignment). packsched is BalanceBatch through the in-process planner.

Run: PYTHONPATH=build/python python3 tests/bench/schedule_bench.py [--seeds 10] [--quick]
     [--grid | --timing | --checks]
"""

import argparse
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


def karmarkar_karp(costs, k, equal_size):
    """k-way largest differencing: returns k lists of positions."""
    order = sorted(range(len(costs)), key=lambda i: (costs[i], i))
    heap = []
    if equal_size:
        assert len(costs) % k == 0
        chunks = [order[s : s + k] for s in range(0, len(order), k)]
        for c, chunk in enumerate(chunks):
            sets = [([i], costs[i]) for i in chunk]
            heapq.heappush(heap, (-(sets[-1][1] - sets[0][1]), c, sets))
    else:
        for c, i in enumerate(order):
            sets = [([i], costs[i])] + [([], 0) for _ in range(k - 1)]
            heapq.heappush(heap, (-costs[i], c, sets))
    tick = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        a = sorted(a, key=lambda s: -s[1])
        b = sorted(b, key=lambda s: s[1])
        merged = sorted([(x[0] + y[0], x[1] + y[1]) for x, y in zip(a, b)], key=lambda s: s[1])
        heapq.heappush(heap, (-(merged[-1][1] - merged[0][1]), tick, merged))
        tick += 1
    return [s[0] for s in heap[0][2]] if heap else [[] for _ in range(k)]


def verl(lengths, world, cap, retry):
    costs = [cost(x) for x in lengths]
    ranks = karmarkar_karp(costs, world, equal_size=True)
    k = max(math.ceil(sum(lengths[i] for i in r) / cap) for r in ranks)
    while True:
        grid = []
        for r in ranks:
            parts = karmarkar_karp([costs[i] for i in r], k, equal_size=False)
            grid.append([[r[j] for j in p] for p in parts])
        fits = all(sum(lengths[i] for i in p) <= cap for row in grid for p in row)
        if fits or not retry:
            return grid
        k += 1


def slime(lengths, world, cap):
    bins = []  # [positions, tokens]
    for i, length in enumerate(lengths):
        for b in bins:
            if b[1] + length <= cap:
                b[0].append(i)
                b[1] += length
                break
        else:
            bins.append([[i], length])
    while len(bins) % world:
        bins.sort(key=lambda b: (-b[1], b[0][0] if b[0] else len(lengths)))
        big = bins.pop(0)[0]
        if len(big) < 2:
            bins.append([big, sum(lengths[i] for i in big)])
            bins.append([[], 0])
            continue
        half = len(big) // 2
        for part in (big[:half], big[half:]):
            bins.append([part, sum(lengths[i] for i in part)])
    costs = [sum(cost(lengths[i]) for i in b[0]) for b in bins]
    ranks = karmarkar_karp(costs, world, equal_size=True)
    return [[bins[j][0] for j in r] for r in ranks]


def nemo_rl(lengths, world, cap):
    bins = [[[], 0] for _ in range(world)]  # [positions, tokens]; at least W bins
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b in bins:
            if b[1] + lengths[i] <= cap:
                b[0].append(i)
                b[1] += lengths[i]
                break
        else:
            bins.append([[i], lengths[i]])
    bins.sort(key=lambda b: -sum(cost(lengths[i]) for i in b[0]))
    return [[b[0] for b in bins[r::world]] for r in range(world)]


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


def measure(lengths, world, cap, grid, sort_slots):
    cells = []
    for row in grid:
        c = [(ALPHA + sum(cost(lengths[i]) for i in p)) if p else 0 for p in row]
        cells.append(sorted(c, reverse=True) if sort_slots else c)
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


def checks(seeds):
    """packsched against the best capped peer under sync step, and against the row greedy under
    sync micro_batch on Pareto lengths: how many inputs trail by more than 0.002, and by how much
    at most."""
    behind, worst, count = 0, 0.0, 0
    for name, mix, per_rank, cap in (
        ("long-context", long_mix, 16, 65536),
        ("bimodal", bimodal_mix, 64, 32768),
        ("long-context", long_mix, 32, 131072),
        ("RL", rl_mix, 64, 16384),
    ):
        for world in (8, 32):
            for seed in range(seeds):
                lengths = mix(random.Random(seed), world * per_rank, cap)
                ours = measure(lengths, world, cap, *ours_grid(lengths, world, cap, "step"))
                peers = (
                    verl(lengths, world, cap, retry=True),
                    slime(lengths, world, cap),
                    nemo_rl(lengths, world, cap),
                )
                best = max(measure(lengths, world, cap, g, True)["eff_step"] for g in peers)
                gap = best - ours["eff_step"]
                behind += gap > 0.002
                worst = max(worst, gap)
                count += 1
    print(
        f"sync=step: {behind} of {count} inputs more than 0.002 behind the best capped peer "
        f"(at most {worst:+.4f})"
    )
    behind, worst, count = 0, 0.0, 0
    for shape in (1.1, 1.3, 1.5, 2.0, 2.5):
        for per_rank in (32, 64, 128, 256):
            for seed in range(seeds // 2 or 1):
                rng = random.Random(seed * 7919 + per_rank)
                lengths = pareto_mix(rng, 8 * per_rank, 131072, shape)
                ours = measure(lengths, 8, 131072, *ours_grid(lengths, 8, 131072, "micro_batch"))
                rows = measure(lengths, 8, 131072, row_greedy(lengths, 8, 131072), False)
                gap = rows["eff_mb"] - ours["eff_mb"]
                behind += gap > 0.002
                worst = max(worst, gap)
                count += 1
    print(
        f"sync=micro_batch, Pareto lengths, W = 8, cap 131072: {behind} of {count} inputs more "
        f"than 0.002 behind the row greedy (at most {worst:+.4f})"
    )


def ours_grid(lengths, world, cap, sync):
    grid, _ = ours(lengths, world, cap, sync)
    return grid, False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="the first three inputs only")
    parser.add_argument("--timing", action="store_true", help="the n = 65,536 timing only")
    parser.add_argument("--grid", action="store_true", help="every mix at W = 8, 32 and 128")
    parser.add_argument(
        "--checks", action="store_true", help="sync=step against the peers, and the row greedy"
    )
    args = parser.parse_args()
    if args.checks:
        checks(args.seeds)
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
                rows.setdefault(label, []).append(
                    dict(measure(lengths, world, cap, grid, True), ms=ms)
                )
            for sync in ("step", "micro_batch"):
                start = time.process_time()
                grid, step = ours(lengths, world, cap, sync)
                ms = (time.process_time() - start) * 1e3
                m = dict(measure(lengths, world, cap, grid, False), ms=ms)
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
