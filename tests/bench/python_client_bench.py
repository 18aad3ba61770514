#!/usr/bin/env python3
"""Latency of one Plan from Python against a local sidecar (target: p50 under 5 ms for
1,024 sequences), beside the in-process planner on the same input.

    PYTHONPATH=build/python .venv/bin/python tests/bench/python_client_bench.py \
        [--n 1024] [--calls 500]
"""

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "deploy"))

from gen_lengths import realistic_rl_lengths  # noqa: E402
from sidecar import Sidecar  # noqa: E402

from packsched import planner  # noqa: E402
from packsched.client import SchedulerClient  # noqa: E402


def percentiles(samples):
    samples = sorted(samples)
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--max_token_len", type=int, default=16384)
    args = parser.parse_args()
    batches = [realistic_rl_lengths(args.n, seed) for seed in range(args.calls)]
    loss = [[max(0, x - 600) for x in b] for b in batches]

    with tempfile.TemporaryDirectory() as tmp, Sidecar(tmp) as sidecar:
        with SchedulerClient(sidecar.target) as client:
            client.plan(0, batches[0], args.max_token_len, overlong="isolate")  # connect, warm up
            remote = []
            for i, (lengths, tokens) in enumerate(zip(batches, loss), start=1):
                start = time.perf_counter()
                client.plan(i, lengths, args.max_token_len, overlong="isolate", loss_tokens=tokens)
                remote.append(1000 * (time.perf_counter() - start))
    local = []
    for lengths, tokens in zip(batches, loss):
        start = time.perf_counter()
        planner.plan_local(lengths, args.max_token_len, overlong="isolate", loss_tokens=tokens)
        local.append(1000 * (time.perf_counter() - start))
    for name, samples in (
        ("SchedulerClient.plan (sidecar)", remote),
        ("planner.plan_local (in-process)", local),
    ):
        p50, p99 = percentiles(samples)
        print(f"{name:<34} n={args.n}: p50 {p50:.2f} ms  p99 {p99:.2f} ms  ({len(samples)} calls)")


if __name__ == "__main__":
    main()
