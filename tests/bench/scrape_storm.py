#!/usr/bin/env python3
"""What a storm of /metrics scrapes costs Plan: Plan latency (p50, p99) of one client against one
sidecar with metrics on, without and with a storm of scrapes, in alternating phases, for each
binary given (the baseline build in the same run).

The sidecar and the Plan client share CPU 0; the scrapers run on CPU 1 (where the machine has
two), so what the storm costs Plan is the sidecar's own work for it, not the scrapers' CPU. The
storm: --storm_procs processes, each opening a connection per scrape (GET /metrics, read to the
end), at most --storm_rate scrapes/s in all (0: as fast as they go).

  PYTHONPATH=build/python .venv/bin/python tests/bench/scrape_storm.py \\
      --server new=build/bin/packsched-server --server base=BASE/build/bin/packsched-server
"""

import argparse
import multiprocessing
import os
import pathlib
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from packsched.client import SchedulerClient  # noqa: E402
from sidecar import Sidecar  # noqa: E402


def pin(cpu):
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > cpu:
        os.sched_setaffinity(0, {cpu})


def scraper(port, rate, stop, counter):
    pin(1)
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    interval = 1.0 / rate if rate > 0 else 0.0
    next_time = time.monotonic()
    done = 0
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(request)
                while s.recv(65536):
                    pass
            done += 1
        except OSError:
            pass
        if interval:
            next_time += interval
            delay = next_time - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if done % 50 == 0:
            with counter.get_lock():
                counter.value += 50
            done = 0
    with counter.get_lock():
        counter.value += done


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plan_phase(client, seconds, first_round, lengths):
    latencies = []
    round_ = first_round
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        round_ += 1
        start = time.perf_counter()
        client.plan(round_, lengths, 4096, stream="bench")
        latencies.append(time.perf_counter() - start)
    latencies.sort()
    return latencies, round_


def measure(label, server, args):
    lengths = [(i * 7919) % 4000 + 1 for i in range(args.n)]
    results = {"quiet": [], "storm": []}
    with tempfile.TemporaryDirectory() as tmp:
        metrics_file = pathlib.Path(tmp, "metrics-port")
        cpus = "0" if (os.cpu_count() or 1) > 1 else None
        sidecar = Sidecar(
            tmp,
            "--metrics_listen=127.0.0.1:0",
            f"--metrics_port_file={metrics_file}",
            server=server,
            prefix=("taskset", "-c", cpus) if cpus else (),
        )
        try:
            while not metrics_file.exists():
                time.sleep(0.01)
            port = int(metrics_file.read_text())
            with SchedulerClient(sidecar.target, timeout=30) as client:
                round_ = 0
                _, round_ = plan_phase(client, 1.0, round_, lengths)  # warm-up
                for _ in range(args.pairs):
                    for phase in ("quiet", "storm"):
                        stop = multiprocessing.Event()
                        counter = multiprocessing.Value("q", 0)
                        procs = []
                        if phase == "storm":
                            procs = [
                                multiprocessing.Process(
                                    target=scraper,
                                    args=(port, args.storm_rate / args.storm_procs, stop, counter),
                                )
                                for _ in range(args.storm_procs)
                            ]
                            for p in procs:
                                p.start()
                            time.sleep(0.5)
                        cpu0 = cpu_seconds(sidecar.pid)
                        with counter.get_lock():
                            scraped0 = counter.value
                        t0 = time.monotonic()
                        latencies, round_ = plan_phase(client, args.seconds, round_, lengths)
                        elapsed = time.monotonic() - t0
                        with counter.get_lock():
                            scraped = counter.value - scraped0
                        cpu = cpu_seconds(sidecar.pid) - cpu0
                        stop.set()
                        for p in procs:
                            p.join(10)
                        results[phase].append(
                            {
                                "p50_ms": 1e3 * latencies[len(latencies) // 2],
                                "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)],
                                "plans": len(latencies),
                                "scrapes_per_s": scraped / elapsed,
                                "sidecar_cpu": cpu / elapsed,
                            }
                        )
        finally:
            sidecar.stop()
    row = {}
    for phase in ("quiet", "storm"):
        runs = results[phase]
        row[phase] = {
            key: statistics.median(r[key] for r in runs)
            for key in ("p50_ms", "p99_ms", "scrapes_per_s", "sidecar_cpu")
        }
        row[phase]["p50_each"] = [round(r["p50_ms"], 3) for r in runs]
    row["p50_ratio"] = row["storm"]["p50_ms"] / row["quiet"]["p50_ms"]
    print(f"{label}: {row}", flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", action="append", required=True, help="LABEL=BINARY")
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase")
    parser.add_argument("--pairs", type=int, default=3, help="quiet/storm pairs per binary")
    parser.add_argument("--storm_rate", type=float, default=1500.0, help="scrapes/s; 0: max")
    parser.add_argument("--storm_procs", type=int, default=3)
    parser.add_argument("--n", type=int, default=1024, help="sequences per Plan")
    args = parser.parse_args()
    pin(0)
    rows = {}
    for spec in args.server:
        label, _, binary = spec.partition("=")
        rows[label] = measure(label, binary, args)
    print("| build | Plan p50 quiet | Plan p50 storm | ratio | scrapes/s | sidecar CPU in storm |")
    print("|---|---|---|---|---|---|")
    for label, row in rows.items():
        q, s = row["quiet"], row["storm"]
        print(
            f"| {label} | {q['p50_ms']:.3f} ms | {s['p50_ms']:.3f} ms | {row['p50_ratio']:.3f} | "
            f"{s['scrapes_per_s']:.0f} | {s['sidecar_cpu']:.2f} core (quiet "
            f"{q['sidecar_cpu']:.2f}) |"
        )


if __name__ == "__main__":
    sys.exit(main())
