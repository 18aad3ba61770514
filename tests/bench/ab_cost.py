#!/usr/bin/env python3
"""Compares the cost of two builds of the sidecar: CPU time and instructions per plan.

    .venv/bin/python tests/bench/ab_cost.py --base=OLD/build --new=build [--pairs=5] [--callgrind]
        [--callgrind_runs=N]

Two measures, each run on both builds in the same minutes:
- CPU time, interleaved pairs (base then new, new then base, ...): `load_bench` (8 clients,
  closed loop; the server's CPU per plan) and `group_bench` (W = 4 sidecars on loopback; the
  whole machine's CPU per round, so nothing else may run). The median over the pairs of each
  build is reported, with every run's value.
- Instructions (`--callgrind`; repeatable whatever else the machine does): one sidecar under
  callgrind serving `load_bench --clients=1` (counters zeroed once it serves, so start-up is
  not counted), and a W = 2 group under callgrind (`group_bench`, every process traced; the
  sidecars' instructions per round, formation included and amortised over the rounds).

Prints a Markdown table for docs/benchmarks.md. Each build directory must hold bin/load_bench,
bin/group_bench and bin/packsched-server (a Release build with benchmarks).

One build, two configurations (e.g. metrics off and on): give the same directory twice and the
sidecar's extra flags per side, comma-separated; --skip_group leaves out group_bench, which
starts its sidecars without them:

    ab_cost.py --base=build --new=build --new_flags=--metrics_listen=127.0.0.1:0 --skip_group
"""
import argparse
import glob
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd, timeout):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def number(pattern, text, what):
    match = re.search(pattern, text)
    if not match:
        sys.exit(f"no '{what}' in output:\n{text}")
    return float(match.group(1))


def load_cpu(build, seconds, flags):
    cmd = [f"{build}/bin/load_bench", f"--duration={seconds}s"]
    if flags:
        cmd.append(f"--server_flags={','.join(flags)}")
    out = run(cmd, timeout=seconds + 60)
    if number(r"errors\s+(\d+)", out, "errors") != 0:
        sys.exit(f"load_bench reported errors:\n{out}")
    return number(r"CPU per plan\s+server ([\d.]+) ms", out, "server CPU per plan")


def group_cpu(build, rounds):
    out = run([f"{build}/bin/group_bench", f"--rounds={rounds}"], timeout=600)
    return number(r"machine CPU per round .*?: ([\d.]+) ms", out, "machine CPU per round")


def total_ir(path):
    with open(path) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    sys.exit(f"no instruction total in {path}")


def callgrind_sidecar(build, seconds, tmp, flags):
    port_file = os.path.join(tmp, "port")
    out_file = os.path.join(tmp, "sidecar.cg")
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out_file}",
            f"{build}/bin/packsched-server",
            "--listen=127.0.0.1:0",
            f"--port_file={port_file}",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.time() > deadline or server.poll() is not None:
                sys.exit("the sidecar under callgrind did not start")
            time.sleep(0.2)
        target = f"127.0.0.1:{open(port_file).read().strip()}"
        # Start-up is not counted; the stream's first round (its worker thread) is, amortised
        # over the run (a second load_bench would reuse the stream's evicted round numbers).
        run(["callgrind_control", "--zero", str(server.pid)], 60)
        out = run(
            [
                f"{build}/bin/load_bench",
                f"--target={target}",
                "--clients=1",
                f"--duration={seconds}s",
                "--warmup=0s",
            ],
            timeout=seconds + 300,
        )
        plans = number(r"plans\s+(\d+)", out, "plans")
        run(["callgrind_control", "--dump=measured", str(server.pid)], 120)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    dumps = sorted(glob.glob(out_file + "*"))
    measured = [d for d in dumps if "measured" in open(d, errors="replace").read(4096)]
    if not measured:
        sys.exit(f"no measured dump among {dumps}")
    return total_ir(measured[0]) / plans


def callgrind_group(build, rounds, tmp):
    pattern = os.path.join(tmp, "group.%p.cg")
    run(
        [
            "valgrind",
            "--tool=callgrind",
            "--trace-children=yes",
            f"--callgrind-out-file={pattern}",
            f"{build}/bin/group_bench",
            "--world_size=2",
            f"--rounds={rounds}",
            "--warmup=5",
        ],
        timeout=1800,
    )
    servers = 0
    total = 0
    for path in glob.glob(os.path.join(tmp, "group.*.cg")):
        with open(path, errors="replace") as f:
            head = f.read(4096)
        if "packsched-server" in head:
            servers += 1
            total += total_ir(path)
    if servers != 2:
        sys.exit(f"expected 2 sidecar profiles in {tmp}, found {servers}")
    return total / (rounds + 5)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the previous build directory")
    parser.add_argument("--new", required=True, help="this build directory")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--load_seconds", type=int, default=10)
    parser.add_argument("--group_rounds", type=int, default=300)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument(
        "--callgrind_runs",
        type=int,
        default=1,
        help="callgrind measures per build, alternating which goes first; the median is reported "
        "(the totals include gRPC's idle polling and the group's formation, which move by 1-2%% "
        "between runs on a loaded machine)",
    )
    parser.add_argument("--base_flags", default="", help="extra sidecar flags, comma-separated")
    parser.add_argument("--new_flags", default="", help="extra sidecar flags, comma-separated")
    parser.add_argument("--skip_group", action="store_true", help="no group_bench measures")
    args = parser.parse_args()
    builds = {"base": args.base, "new": args.new}
    flags = {
        "base": [f for f in args.base_flags.split(",") if f],
        "new": [f for f in args.new_flags.split(",") if f],
    }

    rows = []
    if args.callgrind:
        measured = {name: ([], []) for name in builds}
        for run_index in range(args.callgrind_runs):
            order = list(builds.items())
            if run_index % 2 == 1:
                order.reverse()
            for name, build in order:
                with tempfile.TemporaryDirectory() as tmp:
                    sidecar = callgrind_sidecar(build, 20, tmp, flags[name])
                group = float("nan")
                if not args.skip_group:
                    with tempfile.TemporaryDirectory() as tmp:
                        group = callgrind_group(build, 100, tmp)
                print(
                    f"{name}: sidecar {sidecar / 1e6:.3f} M instructions per plan, "
                    f"W = 2 group {group / 1e6:.3f} M per round",
                    flush=True,
                )
                measured[name][0].append(sidecar)
                measured[name][1].append(group)
        for name in builds:
            sidecars, groups = measured[name]
            rows.append((name, statistics.median(sidecars), statistics.median(groups)))

    load = {name: [] for name in builds}
    group = {name: [] for name in builds}
    for pair in range(args.pairs):
        # Alternate which build goes first, so a drift in the machine's load favours neither.
        order = list(builds.items()) if pair % 2 == 0 else list(reversed(builds.items()))
        for name, build in order:
            load[name].append(load_cpu(build, args.load_seconds, flags[name]))
            if not args.skip_group:
                group[name].append(group_cpu(build, args.group_rounds))
            else:
                group[name].append(float("nan"))
            print(
                f"pair {pair + 1} {name}: load_bench server {load[name][-1]:.3f} ms/plan, "
                f"group_bench machine {group[name][-1]:.2f} ms/round",
                flush=True,
            )

    print()
    print("| measure | base | new | new / base |")
    print("|---|---|---|---|")
    if rows:
        (_, bs, bg), (_, ns, ng) = rows
        for label, b, n in (
            ("callgrind, sidecar: instructions per plan", bs, ns),
            ("callgrind, W = 2 group: sidecar instructions per round", bg, ng),
        ):
            if args.skip_group and "group" in label:
                continue
            if args.callgrind_runs > 1:
                label = f"{label}, median of {args.callgrind_runs} runs"
            print(f"| {label} | {b / 1e6:.3f} M | {n / 1e6:.3f} M | {n / b:.3f} |")
    for label, values in (
        ("load_bench: server CPU ms per plan", load),
        ("group_bench (W = 4): machine CPU ms per round", group),
    ):
        if (args.skip_group and values is group) or args.pairs == 0:
            continue
        b = statistics.median(values["base"])
        n = statistics.median(values["new"])
        runs = "; ".join(f"{x:.3f}/{y:.3f}" for x, y in zip(values["base"], values["new"]))
        label = f"{label}, median of {args.pairs} pairs (base/new: {runs})"
        print(f"| {label} | {b:.3f} | {n:.3f} | {n / b:.3f} |")


if __name__ == "__main__":
    main()
