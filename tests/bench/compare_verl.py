#!/usr/bin/env python3
"""packsched's planner (through the `packsched plan` CLI) beside a plain-Python k-way
Karmarkar-Karp in verl's formulation, on the same generated realistic RL mixes.

The baseline is deploy/verl_kk.py (written there, not verl's code): verl's seqlen balancing
(get_seqlen_balanced_partitions / rearrange_micro_batches) at k = ceil(total / cap), the largest
differencing method over n states of k sums, O(n k log k) time and O(n k) memory; nothing
checks the cap afterwards.

For each input it prints wall time, k, max/mean (largest micro-batch over the mean) and the
micro-batches over the cap, for:
  python-kk   the baseline at verl's k = ceil(total / cap)
  packsched   `packsched plan --max_token_len=CAP --overlong=isolate --format=json`, timed end
              to end as a process, and the planner call alone (plan_ms from its JSON)
  python-kk@k the reference for "kk within 0.1% of a plain largest-differencing implementation
              at the same k": packsched with --overlong=drop (so that no single overlong
              sequence sets both maxima) beside the baseline on the same kept lengths at
              packsched's k
Over-cap micro-batches are split into those holding one sequence longer than the cap (no plan
can avoid them) and the rest. The baseline is skipped where n*k would exceed --max_slots
(memory budget: about 16 bytes per slot in this representation, plus its time).

Also times `packsched plan --num_parts=256` on 4,096 lengths end to end (a loop of processes).

    compare_verl.py --packsched build/bin/packsched
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
from gen_lengths import realistic_rl_lengths  # noqa: E402
from verl_kk import python_kk  # noqa: E402

CASES = [(4096, 16384), (16384, 65536), (65536, 16384)]
SEED = 1


def describe(lengths, parts, cap):
    sums = [sum(lengths[i] for i in p) for p in parts]
    over = [p for p, s in zip(parts, sums) if s > cap]
    unavoidable = sum(1 for p in over if len(p) == 1)
    mean = sum(sums) / len(parts)
    return {
        "k": len(parts),
        "max": max(sums),
        "max_over_mean": max(sums) / mean,
        "over_cap": len(over),
        "over_cap_unavoidable": unavoidable,
    }


def run_packsched(binary, lengths_path, args):
    start = time.perf_counter()
    done = subprocess.run(
        [binary, "plan", f"--lengths={lengths_path}", "--format=json"] + args,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    return json.loads(done.stdout), wall


def row(name, seconds, d, extra=""):
    print(
        f"  {name:<14} {seconds * 1e3:>10.1f} ms  k={d['k']:<6} max/mean={d['max_over_mean']:.4f}"
        f"  over cap={d['over_cap']} ({d['over_cap_unavoidable']} unavoidable){extra}"
    )


def compare(binary, n, cap, max_slots, workdir):
    lengths = realistic_rl_lengths(n, SEED)
    path = os.path.join(workdir, f"lengths_{n}.txt")
    with open(path, "w") as f:
        f.write("".join(f"{x}\n" for x in lengths))
    total = sum(lengths)
    verl_k = math.ceil(total / cap)
    longer = sum(1 for x in lengths if x > cap)
    print(
        f"n={n} cap={cap}: {total} tokens, ceil(total/cap)={verl_k}, "
        f"{longer} sequences longer than the cap"
    )

    plan, wall = run_packsched(binary, path, [f"--max_token_len={cap}", "--overlong=isolate"])
    parts = [p["indices"] for p in plan["micro_batches"]]
    ours = describe(lengths, parts, cap)
    plan_ms = plan["timing"]["plan_ms"]
    row("packsched", wall, ours, f"  (planner alone {plan_ms:.1f} ms)")
    result = {"n": n, "cap": cap, "packsched": dict(ours, wall_ms=wall * 1e3, plan_ms=plan_ms)}

    if n * verl_k > max_slots:
        print(
            f"  {'python-kk':<14} skipped: n*k = {n * verl_k} state slots exceed --max_slots="
            f"{max_slots} (about {n * verl_k * 16 / 2**30:.1f} GiB)"
        )
    else:
        start = time.perf_counter()
        base = describe(lengths, python_kk(lengths, verl_k), cap)
        seconds = time.perf_counter() - start
        row("python-kk", seconds, base, f"  ({seconds * 1e3 / plan_ms:.0f}x the planner call)")
        result["python-kk"] = dict(base, ms=seconds * 1e3)

    # Same k, same sequences: overlong ones dropped on both sides.
    dropped_plan, dropped_wall = run_packsched(
        binary, path, [f"--max_token_len={cap}", "--overlong=drop"]
    )
    dropped = set(dropped_plan["dropped"])
    kept = [i for i in range(n) if i not in dropped]
    kept_lengths = [lengths[i] for i in kept]
    position = {index: p for p, index in enumerate(kept)}
    dropped_parts = [[position[i] for i in p["indices"]] for p in dropped_plan["micro_batches"]]
    same = describe(kept_lengths, dropped_parts, cap)
    k = same["k"]
    row(
        "packsched-drop",
        dropped_wall,
        same,
        f"  (planner alone {dropped_plan['timing']['plan_ms']:.1f} ms)",
    )
    if len(kept) * k > max_slots:
        print(
            f"  {'python-kk@k':<14} skipped: n*k = {len(kept) * k} state slots exceed "
            f"--max_slots={max_slots} (about {len(kept) * k * 16 / 2**30:.1f} GiB)"
        )
        return result
    start = time.perf_counter()
    base = describe(kept_lengths, python_kk(kept_lengths, k), cap)
    seconds = time.perf_counter() - start
    ratio = same["max"] / base["max"]
    row("python-kk@k", seconds, base, f"  packsched max / python max = {ratio:.5f}")
    result["same_k"] = {
        "packsched": same,
        "python": dict(base, ms=seconds * 1e3),
        "max_ratio": ratio,
    }
    return result


def time_fixed_k(binary, workdir, runs):
    lengths = realistic_rl_lengths(4096, SEED)
    path = os.path.join(workdir, "lengths_4096.txt")
    with open(path, "w") as f:
        f.write("".join(f"{x}\n" for x in lengths))
    out = {}
    for fmt in ("table", "json"):
        walls = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(
                [binary, "plan", f"--lengths={path}", "--num_parts=256", f"--format={fmt}"],
                stdout=subprocess.DEVNULL,
                check=True,
            )
            walls.append(time.perf_counter() - start)
        out[fmt] = {"median_ms": statistics.median(walls) * 1e3, "min_ms": min(walls) * 1e3}
        print(
            f"packsched plan --num_parts=256 --format={fmt} on 4,096 lengths, end to end "
            f"({runs} processes): median {out[fmt]['median_ms']:.2f} ms, "
            f"min {out[fmt]['min_ms']:.2f} ms"
        )
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packsched", default="build/bin/packsched")
    parser.add_argument(
        "--max_slots",
        type=int,
        default=20_000_000,
        help="skip the Python baseline above this many n*k state slots",
    )
    parser.add_argument("--runs", type=int, default=50, help="processes for the fixed-k timing")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--workdir", default="build/compare_verl")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    results = {
        "cases": [compare(args.packsched, n, cap, args.max_slots, args.workdir) for n, cap in CASES]
    }
    results["fixed_k_256"] = time_fixed_k(args.packsched, args.workdir, args.runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
