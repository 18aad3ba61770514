#!/usr/bin/env python3
"""The memory estimate against the peak on adversarial shapes (docs/benchmarks.md, memory per
request): per shape (tests/python/memory_shapes.py) a fresh packsched-server in a memory cgroup
(tests/python/memory_cgroup.py; none where it cannot be made) serves the request once; the row
gives the estimate (read from a second server's refusal, --max_inflight_bytes=1), the growth of
the server's VmHWM over its value before the request, the answer and whether the kernel killed
the server. Nothing is timed.

    PYTHONPATH=build/python tests/bench/forest_memory_bench.py --server build/bin/packsched-server
    ... --server BASE/build/bin/packsched-server           (the baseline: another build)
    ... --budget 0 --limit 3221225472                      (no budget: every shape's real peak)
"""
import argparse
import os
import re
import sys
import tempfile

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "python")]
from memory_cgroup import MemoryCgroup  # noqa: E402
from memory_shapes import shapes  # noqa: E402
from sidecar import Sidecar  # noqa: E402
from packsched.v1 import scheduler_pb2_grpc as pb_grpc  # noqa: E402

MIB = 1 << 20
ESTIMATE = re.compile(r"needs an estimated (\d+) bytes")


def channel(sidecar):
    return grpc.insecure_channel(
        sidecar.target,
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    )


def call(sidecar, method, request, timeout):
    """(status code, details) of one call."""
    with channel(sidecar) as ch:
        try:
            getattr(pb_grpc.SchedulerStub(ch), method)(request, timeout=timeout)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""


def estimate_of(server, method, request, workdir):
    with Sidecar(workdir, "--max_inflight_bytes=1", server=server, log=os.devnull) as s:
        code, details = call(s, method, request, 60)
    match = ESTIMATE.search(details)
    return int(match[1]) if code == grpc.StatusCode.RESOURCE_EXHAUSTED and match else None


def measure(server, method, request, workdir, limit, flags, timeout=120):
    """(VmHWM growth, code, details, killed by the kernel) of one request on a fresh server."""
    group = MemoryCgroup.open(limit)
    try:
        prefix = group.prefix if group else ()
        with Sidecar(workdir, *flags, server=server, prefix=prefix, log=os.devnull) as s:
            before = s.peak_rss_bytes()
            code, details = call(s, method, request, timeout)
            try:
                growth = s.peak_rss_bytes() - before
            except RuntimeError:  # no VmHWM: the process has ended
                growth = None
            killed = growth is None or s.poll() is not None
        return growth, code, details, killed or bool(group and group.oom_kills())
    finally:
        if group:
            group.remove()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--budget", type=int, default=None, help="--max_inflight_bytes")
    parser.add_argument("--limit", type=int, default=512 * MIB, help="the cgroup's limit")
    parser.add_argument("--only", default="", help="shapes whose name contains this")
    args = parser.parse_args()
    flags = [] if args.budget is None else [f"--max_inflight_bytes={args.budget}"]
    print("| shape | estimate | peak growth | answer |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        for name, method, request in shapes(np.random.default_rng(7)):
            if args.only not in name:
                continue
            estimate = estimate_of(args.server, method, request, workdir)
            growth, code, details, killed = measure(
                args.server, method, request, workdir, args.limit, flags
            )
            est = "-" if estimate is None else f"{estimate / MIB:.1f} MiB"
            peak = "killed" if killed else f"{growth / MIB:.1f} MiB"
            answer = code.name + (f": {details[:60]}" if code != grpc.StatusCode.OK else "")
            print(f"| {name} | {est} | {peak} | {answer} |", flush=True)


if __name__ == "__main__":
    main()
