#!/usr/bin/env python3
"""How long a sidecar takes to exit on SIGTERM, against its --shutdown_grace.

For each case a fresh packsched-server (a group of one, --shutdown_grace=2s) plans one round for
a connected client, which stays connected; SIGTERM follows the answer after a delay; the time
from SIGTERM to the process's exit is measured. Cases: a 100-sequence plan, and a
1,048,576-sequence plan (a response of about 20 MB), each with delays of 0, 0.5 and 2 s.

Run: PYTHONPATH=build/python .venv/bin/python tests/bench/shutdown_bench.py \
         --server build/bin/packsched-server [--repeat 3]
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

from packsched import SchedulerClient

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from sidecar import Sidecar  # noqa: E402  (tests/python: the server-start helper)


def one(server, workdir, n, delay):
    sidecar = Sidecar(
        workdir,
        "--shutdown_grace=2s",
        f"--max_sequences_per_request={max(n, 1 << 20)}",
        server=server,
    )
    try:
        rng = random.Random(1)
        lengths = [rng.randint(1, 4000) for _ in range(n)]
        with SchedulerClient(sidecar.target, timeout=120) as client:
            client.plan(1, lengths, 16384, stream="s")
            time.sleep(delay)
            start = time.monotonic()
            sidecar.terminate(timeout=60)
            return time.monotonic() - start
    finally:
        sidecar.kill()  # only if it is still running


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| plan | SIGTERM after the answer | exit after SIGTERM, median (max) |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for n in (100, 1 << 20):
            for delay in (0.0, 0.5, 2.0):
                times = [one(args.server, workdir, n, delay) for _ in range(args.repeat)]
                print(
                    f"| n = {n:,} | {delay:g} s | {statistics.median(times):.2f} s "
                    f"({max(times):.2f} s) |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
