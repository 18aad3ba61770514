#!/usr/bin/env python3
"""In-process planning (packsched.planner.plan_local) against `packsched plan` on the same lengths:
wall time and peak RSS of each as a fresh process (docs/benchmarks.md, plan_local against the
CLI).

For each n, one lengths file (uniform in [1, 8191], numpy seed 0) and one cap (65,536 tokens);
then, --repeat times, interleaved: the CLI (`--format=json` to /dev/null, reading the file and
writing the plan included) and a Python process per --python directory that loads the file
with numpy and calls plan_local (import and load outside the timed call; the process's peak
RSS covers everything). Times are medians; peak RSS is the process's ru_maxrss.

    PYTHONPATH=build/python tests/bench/plan_local_bench.py --cli build/bin/packsched \\
        --python build/python [--python /tmp/base/python] [--n 1000000 --n 10000000]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CAP = 65536

CHILD = r"""
import sys, time, numpy as np
sys.path.insert(0, sys.argv[1])
from packsched.planner import plan_local
lengths = np.loadtxt(sys.argv[2], dtype=np.int64)
start = time.perf_counter()
plan = plan_local(lengths, int(sys.argv[3]))
print(time.perf_counter() - start, len(plan.micro_batches))
"""


def run(argv, stdout=subprocess.DEVNULL):
    """(wall seconds, peak RSS MiB, stdout) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE if stdout is None else stdout)
    out = proc.stdout.read() if stdout is None else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"{argv[:2]} failed with status {status}")
    return wall, usage.ru_maxrss / 1024, out.decode()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    parser.add_argument("--python", action="append", required=True, help="a PYTHONPATH dir")
    parser.add_argument("--n", action="append", type=float, help="lengths (default 10^6)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| n | what | wall s (median) | plan_local call s | peak RSS MiB (max) | k |")
    print("|---|---|---|---|---|---|")
    for n in [int(x) for x in (args.n or [1e6])]:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "lengths.txt")
            np.savetxt(path, np.random.default_rng(0).integers(1, 8192, size=n), fmt="%d")
            rows = {}
            for _ in range(args.repeat):
                wall, rss, _ = run(
                    [
                        args.cli,
                        "plan",
                        f"--lengths={path}",
                        f"--max_token_len={CAP}",
                        "--format=json",
                        "--progress=false",
                    ]
                )
                rows.setdefault("packsched plan (CLI)", []).append((wall, None, rss, ""))
                for directory in args.python:
                    wall, rss, out = run(
                        [sys.executable, "-c", CHILD, directory, path, str(CAP)], stdout=None
                    )
                    call, k = out.split()
                    rows.setdefault(f"plan_local ({directory})", []).append(
                        (wall, float(call), rss, k)
                    )
            for what, runs in rows.items():
                calls = [r[1] for r in runs if r[1] is not None]
                call = f"{statistics.median(calls):.2f}" if calls else ""
                wall = statistics.median(r[0] for r in runs)
                rss = max(r[2] for r in runs)
                print(f"| {n:,} | {what} | {wall:.2f} | {call} | {rss:.0f} | {runs[0][3]} |")


if __name__ == "__main__":
    main()
