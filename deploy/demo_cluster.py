#!/usr/bin/env python3
"""The README's main job: a local multi-rank packsched group planning realistic RL batches.

Starts W packsched-server sidecars on loopback (rank 0 last: ranks may start in any order) that
form one rank group over Gloo through rank 0's rendezvous store, then simulates a trainer with one
client process per data-parallel rank (as in a real job, so no rank waits on another's Python):
every round, each rank plans its own batch (a realistic RL mix, a different size per rank) on two
streams, and the sidecars agree the micro-batch count. Prints a table per round, then where a
rank-round's time goes, apart for the formation rounds (a stream's first round forms its
collective) and the steady ones: the end-to-end call, the sidecar's own phases from its PlanStats
(local plan, agreement, partition), the time a rank waited for its peers (the ranks' skew), and
the rest (gRPC and the Python client). Closes with the plain-Python Karmarkar-Karp (verl's
formulation: k = ceil(total / cap)) on the same batches: its time and the micro-batches it leaves
over the cap, separating single sequences longer than the cap (unavoidable) from avoidable ones,
then each sidecar's metrics address (--metrics_listen) with one line of its headline metrics.
Prints each round's token accounting (logical, executed and loss-bearing tokens; the tree token
ratio where plans share prefixes) and checks the sidecars' per-stream token counters against it.
Stops every sidecar with SIGTERM and exits 0 only if each one exited 0.

    deploy/demo_cluster.py [--world_size 4] [--rounds 3] [--n 1024] [--max_token_len 16384]
"""

import argparse
import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The package built into build/python (PACKSCHED_PYTHON_DIR: another build's, as ctest passes).
sys.path.insert(0, os.environ.get("PACKSCHED_PYTHON_DIR", str(ROOT / "build" / "python")))
sys.path.insert(0, str(ROOT / "deploy"))

from gen_lengths import realistic_rl_lengths  # noqa: E402
from verl_kk import python_kk  # noqa: E402  (the plain-Python baseline)

import packsched.client  # noqa: E402

STREAMS = ("actor_logprob", "actor_update")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_group(server, world_size, workdir, backend):
    """Starts the sidecars (rank 0 last) and returns (processes, trainer-facing ports)."""
    rendezvous = f"127.0.0.1:{free_port()}"
    procs = {}
    for rank in reversed(range(world_size)):
        port_file = workdir / f"rank{rank}.port"
        log = open(workdir / f"rank{rank}.log", "w")
        procs[rank] = subprocess.Popen(
            [
                server,
                f"--rank={rank}",
                f"--world_size={world_size}",
                f"--rendezvous={rendezvous}",
                "--listen=127.0.0.1:0",
                f"--port_file={port_file}",
                f"--backend={backend}",
                "--metrics_listen=127.0.0.1:0",
                f"--metrics_port_file={workdir / f'rank{rank}.metrics'}",
                "--collective_timeout=30s",
                "--log_level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ports = {}
    deadline = time.monotonic() + 30
    while len(ports) < world_size:
        for rank, proc in procs.items():
            if proc.poll() is not None:
                stop_group(list(procs.values()), workdir)
                sys.exit(
                    f"demo: sidecar {rank} exited ({proc.returncode}); "
                    f"see {workdir}/rank{rank}.log"
                )
            port_file = workdir / f"rank{rank}.port"
            metrics_file = workdir / f"rank{rank}.metrics"  # written after the port file
            if rank not in ports and metrics_file.exists():
                ports[rank] = int(port_file.read_text().strip())
        if time.monotonic() > deadline:
            stop_group(list(procs.values()), workdir)
            sys.exit("demo: sidecars did not start within 30 s")
        time.sleep(0.02)
    return [procs[r] for r in range(world_size)], [ports[r] for r in range(world_size)]


def metrics_headlines(workdir, world_size):
    """Each sidecar's metrics address and one line of its headline metrics (/metrics)."""
    lines = []
    for rank in range(world_size):
        address = f"127.0.0.1:{int((workdir / f'rank{rank}.metrics').read_text())}"
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            text = response.read().decode()

        def total(name, **labels):
            """Sum of the samples of `name` whose labels include `labels`."""
            value = 0.0
            for line in text.splitlines():
                m = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
                if not m or m.group(1) != name:
                    continue
                have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
                if all(have.get(k) == v for k, v in labels.items()):
                    value += float(m.group(3))
            return value

        rounds_ok = total("packsched_rounds_total", outcome="OK")
        rounds = total("packsched_rounds_total")
        whole = total("packsched_round_duration_seconds_count", phase="whole")
        mean_ms = (
            1000 * total("packsched_round_duration_seconds_sum", phase="whole") / max(1, whole)
        )
        count = max(1, total("packsched_plan_imbalance_count"))  # successful rounds
        wait_ms = 1000 * total("packsched_round_duration_seconds_sum", phase="wait") / count
        lines.append(
            f"rank {rank}  http://{address}/metrics  rounds {rounds_ok:.0f} ok"
            f" / {rounds - rounds_ok:.0f} failed, mean round {mean_ms:.2f} ms"
            f" (agreement {wait_ms:.2f}),"
            f" imbalance {total('packsched_plan_imbalance_sum') / count:.4f},"
            f" padding saved {100 * total('packsched_plan_padding_saved_ratio_sum') / count:.1f}%,"
            f" over cap avoidable"
            f" {total('packsched_plan_over_cap_micro_batches_total', kind='avoidable'):.0f},"
            f" generation {total('packsched_group_generation'):.0f}"
        )
    return lines


def stop_group(procs, workdir):
    """SIGTERM every sidecar; True if each exits 0 within 15 s (else it is killed)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    clean = True
    for rank, proc in enumerate(procs):
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if code != 0:
            clean = False
            print(
                f"demo: sidecar {rank} exited with {code}; see {workdir}/rank{rank}.log",
                file=sys.stderr,
            )
    return clean


def rank_batch(round_, rank, stream, world_size, n):
    """This rank's batch: a different size per rank, different lengths per round and stream."""
    size = max(1, int(n * (0.5 + rank / max(1, world_size - 1))))
    seed = 1_000_003 * round_ + 1009 * rank + STREAMS.index(stream)
    lengths = realistic_rl_lengths(size, seed)
    return lengths, [max(0, length - 600) for length in lengths]  # response tokens carry the loss


def worker(args):
    """One rank's trainer process: makes its batches, says "ready", waits for "go" on stdin (every
    rank starts together), then plans every (round, stream) through its sidecar in order and
    prints one JSON list: per call, the latency, the plan's count, stats and micro-batches."""
    client = packsched.client.SchedulerClient(f"127.0.0.1:{args.worker_port}", timeout=60)
    rank = args.worker_rank
    calls = [
        (round_, stream, *rank_batch(round_, rank, stream, args.world_size, args.n))
        for round_ in range(1, args.rounds + 1)
        for stream in STREAMS
    ]
    print("ready", flush=True)
    sys.stdin.readline()
    records = []
    for round_, stream, lengths, loss_tokens in calls:
        start = time.perf_counter()
        plan = client.plan(
            round_,
            lengths,
            args.max_token_len,
            stream=stream,
            loss_tokens=loss_tokens,
            overlong="isolate",
        )
        ms = 1000 * (time.perf_counter() - start)
        stats = plan.stats
        records.append(
            {
                "round": round_,
                "stream": stream,
                "ms": ms,
                "k": plan.num_micro_batches,
                "local_k": plan.local_num_micro_batches,
                "local_ms": stats.local_ms,
                "wait_ms": stats.wait_ms,
                "partition_ms": stats.partition_ms,
                "naive": stats.naive_padded_tokens,
                "packed": stats.packed_tokens,
                "accounting": list(dataclasses.astuple(plan.tokens)),
                "tokens": [m.tokens for m in plan.metadata if not m.empty],
                "parts": [list(m.indices) for m in plan.metadata],
            }
        )
    client.close()
    json.dump(records, sys.stdout)


def run_trainer(ports, args):
    """Starts one trainer process per rank, starts them together and returns, per (round,
    stream) in order, the ranks' records (rank order)."""
    procs = []
    for rank, port in enumerate(ports):
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    f"--world_size={args.world_size}",
                    f"--rounds={args.rounds}",
                    f"--n={args.n}",
                    f"--max_token_len={args.max_token_len}",
                    f"--worker_rank={rank}",
                    f"--worker_port={port}",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for rank, proc in enumerate(procs):
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"demo: the trainer process of rank {rank} did not start")
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        per_rank = []
        for rank, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"demo: the trainer process of rank {rank} failed")
            per_rank.append(json.loads(out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [list(calls) for calls in zip(*per_rank)]


TOKEN_KINDS = ("logical", "executed", "forwarded", "loss")  # TokenAccounting's order


def print_tokens(results):
    """Each round's token accounting (docs/design.md "Token accounting"), summed over the ranks:
    logical (the sequences' own tokens), executed (rows forwarded, padding included) and
    loss-bearing tokens; the tree token ratio (forwarded / logical) where a plan shares
    prefixes."""
    trees = any(r["accounting"][2] != r["accounting"][0] for ranks in results for r in ranks)
    print("\ntoken accounting per round, all ranks (Plan.tokens):")
    header = (
        f"{'stream':<14}{'round':>5}{'logical':>12}{'executed':>12}{'loss':>12}"
        f"{'padding':>9}{'loss share':>11}" + (f"{'tree ratio':>11}" if trees else "")
    )
    print(header)
    print("-" * len(header))
    for ranks in results:
        logical, executed, forwarded, loss = (
            sum(r["accounting"][i] for r in ranks) for i in range(len(TOKEN_KINDS))
        )
        print(
            f"{ranks[0]['stream']:<14}{ranks[0]['round']:>5}{logical:>12}{executed:>12}{loss:>12}"
            f"{100 * (executed - forwarded) / max(1, executed):>8.1f}%"
            f"{100 * loss / max(1, logical):>10.1f}%"
            + (f"{forwarded / max(1, logical):>11.3f}" if trees else "")
        )


def token_counters(workdir, rank):
    """{(stream, kind): value} of packsched_stream_<kind>_tokens_total on one sidecar."""
    address = f"127.0.0.1:{int((workdir / f'rank{rank}.metrics').read_text())}"
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.findall(
        r'^packsched_stream_(\w+)_tokens_total\{stream="([^"]*)"\} (\S+)$', text, re.M
    )
    return {(stream, kind): int(float(value)) for kind, stream, value in found}


def check_token_counters(workdir, results):
    """Each sidecar's per-stream token counters against the sum of its plans' accounting; prints
    them per stream and returns True if they agree (the exposition is refreshed once a second)."""
    want = [{} for _ in results[0]]
    for ranks in results:
        for rank, r in enumerate(ranks):
            for kind, value in zip(TOKEN_KINDS, r["accounting"]):
                key = (r["stream"], kind)
                want[rank][key] = want[rank].get(key, 0) + value
    deadline = time.monotonic() + 5
    while True:
        seen = [token_counters(workdir, rank) for rank in range(len(want))]
        if seen == want or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    for stream in STREAMS:
        figures = ", ".join(
            f"{kind} {sum(s.get((stream, kind), 0) for s in seen)}" for kind in TOKEN_KINDS
        )
        print(f'packsched_stream_*_tokens_total{{stream="{stream}"}}, all ranks: {figures}')
    if seen != want:
        print(
            "demo: the sidecars' token counters differ from the plans' accounting", file=sys.stderr
        )
    return seen == want


def phases(rounds):
    """Per rank-round of ``rounds`` (lists of the ranks' records): the end-to-end call and its
    parts. The sidecar's wait is the agreement plus the time this rank's sidecar waited for the
    last peer to arrive; the last to arrive waits for nobody, so the round's smallest wait is the
    agreement itself and the rest of each rank's wait is its wait for peers (the ranks' skew)."""
    out = {"call": [], "local": [], "agreement": [], "peers": [], "partition": [], "rest": []}
    for ranks in rounds:
        agreement = min(r["wait_ms"] for r in ranks)
        for r in ranks:
            sidecar = r["local_ms"] + r["wait_ms"] + r["partition_ms"]
            out["call"].append(r["ms"])
            out["local"].append(r["local_ms"])
            out["agreement"].append(agreement)
            out["peers"].append(r["wait_ms"] - agreement)
            out["partition"].append(r["partition_ms"])
            out["rest"].append(max(0.0, r["ms"] - sidecar))
    return out


def print_phases(results):
    """Where a rank-round's time goes: formation rounds (each stream's first) and steady ones."""
    first = {}
    for ranks in results:
        first.setdefault(ranks[0]["stream"], ranks[0]["round"])
    formation = [ranks for ranks in results if first[ranks[0]["stream"]] == ranks[0]["round"]]
    steady = [ranks for ranks in results if first[ranks[0]["stream"]] != ranks[0]["round"]]
    print(
        "\nwhere a rank-round's time goes, ms (median over rank-rounds; the sidecar's PlanStats):"
    )
    names = [
        ("call", "end-to-end Plan call"),
        ("local", "sidecar: local plan"),
        ("agreement", "sidecar: agreement"),
        ("peers", "sidecar: waiting for peers"),
        ("partition", "sidecar: partition"),
        ("rest", "gRPC + Python client"),
    ]
    columns = [("formation", formation), ("steady", steady)]
    print(
        f"{'':<28}"
        + "".join(f"{f'{name} ({len(r) * len(r[0]) if r else 0})':>20}" for name, r in columns)
    )
    figures = {name: phases(rounds) for name, rounds in columns}
    for key, label in names:
        row = f"{label:<28}"
        for name, rounds in columns:
            values = figures[name][key]
            row += f"{statistics.median(values):>20.2f}" if values else f"{'-':>20}"
        print(row)
    print(
        "(formation: each stream's first round, which forms its collective; agreement: the"
        " round's smallest wait, that of the last rank to arrive; waiting for peers: the rest of"
        " a rank's wait)"
    )
    if figures["steady"]["call"]:
        return "steady", figures["steady"]["call"]
    return "formation", figures["formation"]["call"]  # --rounds 1: no steady round


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world_size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=1024, help="mean sequences per rank and round")
    parser.add_argument("--max_token_len", type=int, default=16384)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument(
        "--keep_logs",
        action="store_true",
        help="keep the sidecars' logs after a clean run (always kept otherwise)",
    )
    parser.add_argument("--server", default=str(ROOT / "build" / "bin" / "packsched-server"))
    parser.add_argument("--worker_rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker_port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_rank is not None:
        worker(args)
        return

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="packsched-demo-"))
    procs, ports = start_group(args.server, args.world_size, workdir, args.backend)
    clean_plans = False
    print(
        f"packsched demo: {args.world_size} sidecars on loopback ({args.backend}), "
        f"max_token_len {args.max_token_len}, ~{args.n} sequences per rank and round, "
        f"one trainer process per rank\n"
    )
    try:
        results = run_trainer(ports, args)
        header = (
            f"{'stream':<14}{'round':>5}{'k':>5}  {'local k per rank':<22}"
            f"{'max tok':>8}{'min tok':>8}{'padding saved':>15}{'p50 ms':>8}{'max ms':>8}"
        )
        print(header)
        print("-" * len(header))
        batches = []
        for ranks in results:
            k = ranks[0]["k"]
            assert all(r["k"] == k for r in ranks), "ranks disagree on k"
            tokens = [t for r in ranks for t in r["tokens"]]
            naive = sum(r["naive"] for r in ranks)
            packed = sum(r["packed"] for r in ranks)
            latencies = [r["ms"] for r in ranks]
            print(
                f"{ranks[0]['stream']:<14}{ranks[0]['round']:>5}{k:>5}  "
                f"{','.join(str(r['local_k']) for r in ranks):<22}"
                f"{max(tokens):>8}{min(tokens):>8}"
                f"{100 * (1 - packed / naive):>14.1f}%"
                f"{statistics.median(latencies):>8.2f}{max(latencies):>8.2f}"
            )
            batches.append(
                [
                    rank_batch(r["round"], rank, r["stream"], args.world_size, args.n)[0]
                    for rank, r in enumerate(ranks)
                ]
            )
        print_tokens(results)
        kind, headline_ms = print_phases(results)
        plans = [[r["parts"] for r in ranks] for ranks in results]
        if not compare(batches, plans, args.max_token_len, headline_ms, kind):
            print("demo: packsched left an avoidable micro-batch over the cap", file=sys.stderr)
            clean_plans = False
        else:
            clean_plans = True
        print("\nthe sidecars' Prometheus metrics (docs/operating.md#metrics):")
        for line in metrics_headlines(workdir, args.world_size):
            print(line)
        if not check_token_counters(workdir, results):
            clean_plans = False
    finally:
        clean = stop_group(procs, workdir)
    if not clean or not clean_plans:
        sys.exit(1)
    if args.keep_logs:
        print(f"\nall {args.world_size} sidecars stopped cleanly (logs in {workdir})")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"\nall {args.world_size} sidecars stopped cleanly")


def over_cap(lengths, parts, cap):
    """(unavoidable, avoidable) micro-batches over the cap: a part holding a single sequence
    longer than the cap cannot be helped; any other part over the cap is the packer's doing."""
    unavoidable = avoidable = 0
    for part in parts:
        if sum(lengths[i] for i in part) <= cap:
            continue
        if len(part) == 1:
            unavoidable += 1
        else:
            avoidable += 1
    return unavoidable, avoidable


def compare(batches, plans, cap, sidecar_ms, kind):
    """packsched's plans against the plain-Python Karmarkar-Karp at verl's k on the same batches."""
    ours = [0, 0]
    parts_ours = 0
    for ranks, rank_plans in zip(batches, plans):
        for lengths, parts in zip(ranks, rank_plans):
            parts_ours += len(parts)
            u, a = over_cap(lengths, parts, cap)
            ours[0] += u
            ours[1] += a
    start = time.perf_counter()
    theirs = [0, 0]
    parts_theirs = 0
    for ranks in batches:
        k = max(math.ceil(sum(lengths) / cap) for lengths in ranks)  # verl: MAX over the group
        for lengths in ranks:
            parts = python_kk(lengths, k)
            parts_theirs += len(parts)
            u, a = over_cap(lengths, parts, cap)
            theirs[0] += u
            theirs[1] += a
    elapsed = 1000 * (time.perf_counter() - start)
    rounds = len(batches)
    print(f"\nthe same {rounds} rounds x {len(batches[0])} ranks, cap {cap} tokens:")
    per_call = elapsed / (rounds * len(batches[0]))
    print(
        f"{'':<46}{'ms per rank-round':>18}{'micro-batches':>15}{'over cap: unavoidable':>23}"
        f"{'avoidable':>11}"
    )
    print(
        f"{f'packsched sidecars (p50 {kind} Plan call)':<46}"
        f"{statistics.median(sidecar_ms):>18.2f}{parts_ours:>15}{ours[0]:>23}{ours[1]:>11}"
    )
    print(
        f"{'plain-Python KK, k = ceil(total / cap)':<46}"
        f"{per_call:>18.2f}{parts_theirs:>15}{theirs[0]:>23}{theirs[1]:>11}"
    )
    print(
        f"(packsched: a {kind} round's whole Plan call as the trainer sees it - local plan,"
        " agreement, waiting for peers, partition, gRPC;\n Python KK: one rank's partition alone,"
        " with no agreement.)"
    )
    print(
        "unavoidable: a micro-batch that is one sequence longer than the cap (isolated);"
        " avoidable: several sequences summing past the cap."
    )
    return ours[1] == 0


if __name__ == "__main__":
    main()
