#!/usr/bin/env python3
"""Peak memory of a fresh packsched-server per request (docs/benchmarks.md, memory per request).

Each case starts a fresh sidecar (a group of one, default limits unless --server_arg adds some),
sends its requests (concurrently when a case has several), and reads the server's VmHWM (peak
RSS) and VmRSS from /proc/PID/status before and after; it prints one table row per case and
the status each request got. Nothing is timed. The cases: the 20-byte amplifiers
(a Plan with n = 2 and min_micro_batches = 1,000,000; a Partition with n = 2 and k = 1,000,000),
both at once, and realistic RL batches up to the default --max_sequences_per_request
(n = 1,048,576) with k up to 1,000,000.

    PYTHONPATH=build/python tests/bench/memory_bench.py --server build/bin/packsched-server
    ... --server /work/base/build/bin/packsched-server      (the baseline)
"""
import argparse
import os
import sys
import tempfile
import threading
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "deploy"), os.path.join(HERE, "..", "python")]
from gen_lengths import realistic_rl_lengths  # noqa: E402
from sidecar import Sidecar  # noqa: E402  (tests/python: the server-start helper)
from packsched.v1 import scheduler_pb2 as pb  # noqa: E402
from packsched.v1 import scheduler_pb2_grpc as pb_grpc  # noqa: E402

MIB = 1 << 20


def proc_status(pid):
    """VmHWM and VmRSS of `pid`, bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) * 1024
    return values["VmHWM"], values["VmRSS"]


class Server:
    """A fresh packsched-server on a free loopback port."""

    def __init__(self, binary, extra_args):
        self.dir = tempfile.TemporaryDirectory()
        self.sidecar = Sidecar(
            self.dir.name, *extra_args, server=binary, log=os.devnull, start_timeout=30
        )
        port = self.sidecar.port
        options = [("grpc.max_receive_message_length", 1 << 30)]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = pb_grpc.SchedulerStub(self.channel)

    def close(self):
        self.channel.close()
        self.sidecar.terminate(timeout=30)
        self.dir.cleanup()


def plan_request(lengths, cap, stream, min_micro_batches=0):
    options = pb.PlanOptions(max_token_len=cap, min_micro_batches=min_micro_batches)
    return pb.PlanRequest(stream=stream, round=1, lengths=lengths, options=options)


def partition_request(lengths, k, cap=0):
    return pb.PartitionRequest(
        lengths=lengths, num_micro_batches=k, options=pb.PlanOptions(max_token_len=cap)
    )


def balance_request(lengths, world_size, cap):
    return pb.BalanceBatchRequest(
        lengths=lengths, world_size=world_size, options=pb.PlanOptions(max_token_len=cap)
    )


def cases(realistic_n):
    lens = realistic_rl_lengths(realistic_n, 1)
    cap = 32768
    return [
        ("Plan n=2 min_micro_batches=1e6", [("Plan", plan_request([1, 1], 8, "a", 1_000_000))]),
        ("Partition n=2 k=1e6", [("Partition", partition_request([1, 1], 1_000_000))]),
        (
            "both amplifiers at once",
            [
                ("Plan", plan_request([1, 1], 8, "a", 1_000_000)),
                ("Partition", partition_request([1, 1], 1_000_000)),
            ],
        ),
        (
            "two Plan amplifiers at once",
            [
                ("Plan", plan_request([1, 1], 8, "a", 1_000_000)),
                ("Plan", plan_request([1, 1], 8, "b", 1_000_000)),
            ],
        ),
        (f"Plan n={realistic_n} cap {cap}", [("Plan", plan_request(lens, cap, "a"))]),
        (
            f"Partition n={realistic_n} k=1e6 cap {cap}",
            [("Partition", partition_request(lens, 1_000_000, cap))],
        ),
        (
            f"Plan n={realistic_n} min_micro_batches=1e6",
            [("Plan", plan_request(lens, cap, "a", 1_000_000))],
        ),
        (
            f"BalanceBatch n={realistic_n} W=8 cap {cap}",
            [("BalanceBatch", balance_request(lens, 8, cap))],
        ),
    ]


def run_case(binary, extra_args, requests):
    server = Server(binary, extra_args)
    try:
        time.sleep(0.2)
        hwm0, rss0 = proc_status(server.sidecar.pid)
        outcomes = [None] * len(requests)
        barrier = threading.Barrier(len(requests))

        def call(i, method, request):
            barrier.wait()
            try:
                response = getattr(server.stub, method)(request, timeout=300)
                k = response.num_micro_batches
                outcomes[i] = f"OK k={k} {response.ByteSize()} B"
            except grpc.RpcError as e:
                outcomes[i] = f"{e.code().name}: {e.details()[:170]}"

        threads = [
            threading.Thread(target=call, args=(i, m, r)) for i, (m, r) in enumerate(requests)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.5)
        hwm, rss = proc_status(server.sidecar.pid)
        return hwm0, rss0, hwm, rss, outcomes
    finally:
        server.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="packsched-server binary")
    parser.add_argument("--server_arg", action="append", default=[], help="extra server flag")
    parser.add_argument("--n", type=int, default=1 << 20, help="realistic batch size")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    args = parser.parse_args()
    print(f"server {args.server} {' '.join(args.server_arg)}")
    print(f"{'case':48} {'start RSS':>10} {'peak RSS':>10} {'RSS after':>10}  outcome")
    for name, requests in cases(args.n):
        if args.only and args.only not in name:
            continue
        hwm0, rss0, hwm, rss, outcomes = run_case(args.server, args.server_arg, requests)
        print(
            f"{name:48} {rss0 / MIB:8.1f} M {hwm / MIB:8.1f} M {rss / MIB:8.1f} M  "
            + " | ".join(outcomes),
            flush=True,
        )


if __name__ == "__main__":
    main()
