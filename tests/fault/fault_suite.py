#!/usr/bin/env python3
"""Fault injection for a rank group of real sidecars (docs/design.md §3, "Rounds that never split").

Each rank's packsched-server runs in its own network namespace, joined to the others by a veth
pair on a bridge in this namespace, where the trainers (one SchedulerClient per rank, threads of
this process) live. Rounds run one after another; into some of them a fault is injected:

  cut1   one-way cut: rank a's packets to rank b are dropped (nftables), from just before the
         round until longer than --collective_timeout after it began: splits the round (a rank
         whose partner's messages arrived finishes; the others time out) when a and b exchange
         messages in a round (recursive-doubling partners: a XOR b a power of two); between
         other ranks no round crosses the cut, and its rounds succeed while it lasts;
  cut2   rank a cut from every peer both ways, at a random point of the round, for longer than
         the timeout;
  kill   kill -9 of a random rank (rank 0 included) at a random point of the round (before,
         during, between agreement and answer, after), restarted with the same flags;
  stop   SIGSTOP of a random rank at a random point, SIGCONT after longer than the timeout;
  slow   rank a's link slowed to 2 Mbit/s with tbf for the round.

Every trainer sends its round again until it gets a plan (the Python client itself resends a
call its own sidecar never answered), then waits for the others, as trainers do at each step.
Checked on every round: every rank gets a plan (no round stays split after resends); every plan
is the one the rank's lengths give at the agreed k, and k is the largest rank's own bound
(computed here by the in-process planner, independently of the sidecars); every call ends within
the timeout plus a margin, plus the fault's own length when it stopped or killed that call's
sidecar. A fault is over when it is undone; it has healed when a round is done on every rank
after that. A fault that no round crossed (no call failed while it lasted: a one-way cut between
ranks that are not partners, a slowdown the timeout absorbed) is counted apart and gives no
healing time. Reported: rounds that were split (some ranks answered, others failed) and healed,
healing time (fault over -> round done on every rank) of the faults rounds crossed, resends, and
each sidecar's memory.

--short is the README's test command's form (ctest fault_suite_test); --long is the benchmark
whose figures are in docs/benchmarks.md. Exits 77 (ctest: skipped) with a message where network
namespaces or nftables cannot be used. Bounded: --max_seconds, after which everything it started
is stopped; namespaces, links and processes (by pid) are removed on every exit path.
"""

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

# tests/python: sidecar.py, the server-start helper.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

SKIP = 77
CAP = 16384
STREAM = "actor"


def sh(*args, check=True):
    """Runs a command (no shell); returns its stdout."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


class Net:
    """W namespaces with one veth each on a bridge; 10.213.<b>.(r+1) is rank r, .254 this side."""

    def __init__(self, world_size):
        tag = os.getpid() % 10000
        routes = sh("ip", "-4", "route")
        free = [b for b in range(20, 250) if f"10.213.{b}." not in routes]
        if not free:
            raise RuntimeError("no free 10.213.x.0/24 subnet")
        self.subnet = f"10.213.{free[os.getpid() % len(free)]}"
        self.bridge = f"psb{tag}"
        self.ns = [f"psn{tag}r{r}" for r in range(world_size)]
        self.veth = [f"psv{tag}r{r}" for r in range(world_size)]
        self.made = []  # what to remove, in reverse order
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        sh("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for r in range(world_size):
            sh("ip", "netns", "add", self.ns[r])
            self.made.append(("netns", self.ns[r]))
            sh(
                "ip",
                "link",
                "add",
                self.veth[r],
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                self.ns[r],
            )
            self.made.append(("link", self.veth[r]))
            sh("ip", "link", "set", self.veth[r], "master", self.bridge, "up")
            self.exec(r, "ip", "addr", "add", f"{self.ip(r)}/24", "dev", "eth0")
            self.exec(r, "ip", "link", "set", "eth0", "up")
            self.exec(r, "ip", "link", "set", "lo", "up")
            self.exec(r, "nft", "add", "table", "inet", "fault")
            for chain, hook in (("out", "output"), ("in", "input")):
                self.exec(
                    r,
                    "nft",
                    "add",
                    "chain",
                    "inet",
                    "fault",
                    chain,
                    f"{{ type filter hook {hook} priority 0; }}",
                )

    def ip(self, rank):
        return f"{self.subnet}.{rank + 1}"

    def exec(self, rank, *args):
        return sh("ip", "netns", "exec", self.ns[rank], *args)

    def drop(self, rank, to=(), frm=()):
        """Drops rank's packets to the ranks `to` and from the ranks `frm`."""
        rules = [("out", "daddr", p) for p in to] + [("in", "saddr", p) for p in frm]
        for chain, field, peer in rules:
            rule = ["inet", "fault", chain, "ip", field, self.ip(peer), "drop"]
            self.exec(rank, "nft", "add", "rule", *rule)

    def slow(self, rank, rate="2mbit"):
        self.exec(
            rank,
            "tc",
            "qdisc",
            "add",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "32kbit",
            "latency",
            "200ms",
        )

    def heal(self, rank):
        self.exec(rank, "nft", "flush", "chain", "inet", "fault", "out")
        self.exec(rank, "nft", "flush", "chain", "inet", "fault", "in")
        sh(
            "ip",
            "netns",
            "exec",
            self.ns[rank],
            "tc",
            "qdisc",
            "del",
            "dev",
            "eth0",
            "root",
            check=False,
        )

    def close(self):
        for kind, name in reversed(self.made):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
            else:
                sh("ip", "link", "del", name, check=False)
        self.made = []


class Sidecars:
    """One packsched-server per namespace; restartable with the same flags."""

    def __init__(self, server, net, world_size, timeout_s, workdir):
        self.server, self.net, self.world_size = server, net, world_size
        self.timeout_s, self.workdir = timeout_s, workdir
        self.procs = [None] * world_size
        self.logs = [os.path.join(workdir, f"rank{r}.log") for r in range(world_size)]
        for r in reversed(range(world_size)):  # rank 0 last, as the demo does
            self.start(r)

    def target(self, rank):
        return f"{self.net.ip(rank)}:50051"

    def start(self, rank):
        from sidecar import Sidecar  # the tests' one server-start helper (needs packsched)

        try:
            self.procs[rank] = Sidecar(
                self.workdir,
                f"--rank={rank}",
                f"--world_size={self.world_size}",
                f"--rendezvous={self.net.ip(0)}:50052",
                f"--collective_timeout={self.timeout_s}s",
                "--backend=gloo",
                "--log_level=info",
                listen=self.target(rank),
                server=self.server,
                prefix=("ip", "netns", "exec", self.net.ns[rank]),
                log=self.logs[rank],
            )
        except RuntimeError as error:
            raise RuntimeError(
                f"rank {rank}'s sidecar did not start ({error}): {self.tail(rank)}"
            ) from None

    def pid(self, rank):
        return self.procs[rank].pid

    def kill(self, rank):
        self.procs[rank].kill()

    def rss_mib(self, rank):
        try:
            with open(f"/proc/{self.pid(rank)}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")

    def tail(self, rank, lines=15):
        try:
            with open(self.logs[rank]) as log:
                return "".join(log.readlines()[-lines:])
        except OSError:
            return ""

    def close(self):
        for proc in self.procs:
            if proc is not None:
                proc.kill()


def lengths_for(round_, rank, n):
    rng = random.Random(round_ * 1009 + rank)
    count = n + rng.randrange(n // 4)
    return [min(CAP, max(16, int(rng.lognormvariate(6.8, 1.0)))) for _ in range(count)]


def partners(a, b):
    """Whether ranks a and b exchange messages in a round (recursive doubling: their ranks differ
    in one bit), or are the same rank."""
    x = a ^ b
    return x & (x - 1) == 0


class Suite:
    def __init__(self, args, net, sidecars, clients):
        self.args, self.net, self.sidecars, self.clients = args, net, sidecars, clients
        self.W = args.world_size
        self.T = args.timeout
        self.rng = random.Random(args.seed)
        self.failures = []
        self.rounds = []  # per round: dict of figures

    def fail(self, message):
        self.failures.append(message)
        print("FAIL:", message, flush=True)

    def run_round(self, round_, fault=None, window=None):
        """One round on every rank, each resending until it has a plan; `fault` and its `window`
        (filled in by the injector while it runs): what may be going on meanwhile."""
        from packsched import SchedulerError

        W = self.W
        lengths = [lengths_for(round_, r, self.args.sequences) for r in range(W)]
        results = [None] * W
        calls = []  # (rank, start, end, error code or None)
        lock = threading.Lock()
        give_up = time.monotonic() + self.args.round_budget

        def trainer(rank):
            while True:
                start = time.monotonic()
                try:
                    plan = self.clients[rank].plan(round_, lengths[rank], CAP, stream=STREAM)
                    code = None
                except SchedulerError as error:
                    plan, code = None, f"{error.code}: {str(error)[:160]}"
                with lock:
                    calls.append((rank, start, time.monotonic(), code))
                if plan is not None:
                    results[rank] = plan
                    return
                if time.monotonic() > give_up:
                    return
                time.sleep(0.1)

        threads = [threading.Thread(target=trainer, args=(r,)) for r in range(W)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.args.round_budget + 4 * self.T + 30)
        done = max((end for _, _, end, code in calls if code is None), default=time.monotonic())
        return self.check(round_, fault, lengths, results, calls, window or {}, done)

    def inject(self, fault, round_time, window):
        """Applies `fault` and undoes it, recording its [begin, end] in `window` (and "broken" if
        it could not be undone: the run stops there)."""
        try:
            self.apply(fault, round_time, window)
        except Exception as error:  # noqa: BLE001 (reported, then the run stops)
            self.fail(f"{fault['kind']} of rank {fault['rank']} could not be undone: {error}")
            window["broken"] = True
        window["end"] = time.monotonic()
        window["applied"].set()

    def apply(self, fault, round_time, window):
        kind, rank = fault["kind"], fault["rank"]
        if kind == "cut1":
            self.net.drop(rank, to=[fault["peer"]])
            window["begin"] = time.monotonic()
            window["applied"].set()
            time.sleep(fault["length"])
            self.net.heal(rank)
        else:
            time.sleep(fault["offset"] * round_time)
            window["begin"] = time.monotonic()
            if kind == "cut2":
                peers = [p for p in range(self.W) if p != rank]
                self.net.drop(rank, to=peers, frm=peers)
                time.sleep(fault["length"])
                self.net.heal(rank)
            elif kind == "slow":
                self.net.slow(rank)
                time.sleep(fault["length"])
                self.net.heal(rank)
            elif kind == "kill":
                window["process"] = rank
                self.sidecars.kill(rank)
                time.sleep(fault["length"])
                self.sidecars.start(rank)  # same flags
            elif kind == "stop":
                window["process"] = rank
                os.kill(self.sidecars.pid(rank), signal.SIGSTOP)
                time.sleep(fault["length"])
                os.kill(self.sidecars.pid(rank), signal.SIGCONT)

    def check(self, round_, fault, lengths, results, calls, window, done):
        from packsched import planner

        W, T = self.W, self.T
        name = f"round {round_} ({fault['kind'] if fault else 'no fault'}"
        name += f", rank {fault['rank']})" if fault else ")"
        missing = [r for r in range(W) if results[r] is None]
        if missing:
            errors = [code for rank, _, _, code in calls if code is not None][-3:]
            self.fail(f"{name}: ranks {missing} got no plan after resends: {errors}")
        else:
            k = max(planner.local_bound(lengths[r], CAP).k for r in range(W))
            for r in range(W):
                got = results[r]
                if got.num_micro_batches != k:
                    self.fail(f"{name}: rank {r} got k={got.num_micro_batches}, agreed bound {k}")
                    continue
                want = planner.partition(lengths[r], k, CAP)
                if got.micro_batches != want.micro_batches:
                    self.fail(f"{name}: rank {r}'s plan differs from its lengths' plan at k={k}")
        margin = self.args.margin
        for rank, start, end, code in calls:
            allowed = T + margin
            if window.get("process") == rank and start < window.get("end", end):
                allowed += window.get("end", end) - start + 5.0  # the restart itself
            if end - start > allowed:
                self.fail(f"{name}: rank {rank}'s call took {end - start:.2f} s > {allowed:.2f} s")
        first = {}
        for rank, _, _, code in calls:
            first.setdefault(rank, code is None)
        split = 0 < sum(first.values()) < W
        figures = {
            "round": round_,
            "fault": fault["kind"] if fault else None,  # going on meanwhile
            "split": split,
            "resends": len(calls) - W,
            "failed_calls": sum(code is not None for *_, code in calls),
        }
        figures["done"] = done
        figures["ok"] = not missing
        self.rounds.append(figures)
        return figures

    def schedule(self):
        """The faults, in a random order, with clean rounds between them."""
        a = self.args
        kinds = (
            ["cut1x"] * a.non_partner_cuts
            + ["cut1"] * a.one_way_cuts
            + ["cut2"] * a.cuts
            + ["kill"] * a.kills
            + ["stop"] * a.stops
            + ["slow"] * a.slows
        )
        self.rng.shuffle(kinds)
        faults = []
        killed_zero = False
        for kind in kinds:
            rank = self.rng.randrange(self.W)
            if kind == "kill" and not killed_zero:
                rank, killed_zero = 0, True  # rank 0 at least once
            # A random point of the round (which includes the trainers' own work); a fault that
            # lands after the sidecars answered hits the round after it instead.
            fault = {"kind": kind, "rank": rank, "offset": self.rng.uniform(0.0, 1.0)}
            if kind == "cut1x":  # a one-way cut between ranks that are not partners
                kind = fault["kind"] = "cut1"
                others = [p for p in range(self.W) if not partners(rank, p)]
                fault["peer"] = self.rng.choice(others or [p for p in range(self.W) if p != rank])
            elif kind == "cut1":
                fault["peer"] = self.rng.choice([p for p in range(self.W) if p != rank])
            if kind in ("cut1", "cut2", "stop"):
                fault["length"] = self.T + self.rng.uniform(0.3, 1.0)
            elif kind == "kill":
                fault["length"] = self.rng.uniform(0.1, 1.0)  # down before the restart
            else:
                fault["length"] = self.rng.uniform(0.5, 1.5)
            faults.append(fault)
        return faults

    def run(self):
        W = self.W
        round_ = 0
        warm = []
        for _ in range(3):  # forms the group and measures a round's length
            round_ += 1
            start = time.monotonic()
            self.run_round(round_)
            warm.append(time.monotonic() - start)
        round_time = statistics.median(warm)
        # Each sidecar's memory after the warm-up rounds, or after its latest restart.
        rss_start = [self.sidecars.rss_mib(r) for r in range(W)]
        rss_base = list(rss_start)
        for fault in self.schedule():
            # The fault runs beside the rounds: it starts at a random point of the next one
            # (a one-way cut: just before it) and may span several.
            window = {"applied": threading.Event()}
            injector = threading.Thread(target=self.inject, args=(fault, round_time, window))
            injector.start()
            if fault["kind"] == "cut1":
                window["applied"].wait(10)
            first = None
            healed = crossed = False
            after = 0  # rounds begun after the fault was over
            while True:
                over = "end" in window
                round_ += 1
                figures = self.run_round(round_, fault, window)
                first = first or figures
                crossed = crossed or figures["failed_calls"] > 0 or not figures["ok"]
                healed = "end" in window and figures["done"] > window["end"] and figures["ok"]
                if healed or window.get("broken"):
                    break  # healed: a round done on every rank after the fault is over
                # Rounds while the fault lasts are bounded by its length; after it, by the count.
                after += over
                if after >= self.args.max_rounds_per_fault:
                    break
            injector.join(60)
            if window.get("broken"):
                break
            if not healed:
                self.fail(
                    f"{fault['kind']} of rank {fault['rank']}: not healed within "
                    f"{self.args.max_rounds_per_fault} rounds after it was over"
                )
                first["healed"] = False
            first["crossed"] = crossed
            first["heal_s"] = figures["done"] - window["end"]
            first["split"] = any(f["split"] for f in self.rounds if f["round"] >= first["round"])
            peer = f" -> {fault['peer']}" if "peer" in fault else ""
            print(
                f"round {first['round']}: {fault['kind']} rank {fault['rank']}{peer}: "
                f"split={first['split']} rounds={round_ - first['round'] + 1} "
                + (f"healed in {first['heal_s']:.2f} s" if crossed else "crossed by no round"),
                flush=True,
            )
            for _ in range(self.args.clean_between):
                round_ += 1
                self.run_round(round_)
            if fault["kind"] == "kill":
                rss_base[fault["rank"]] = self.sidecars.rss_mib(fault["rank"])
        rss_end = [self.sidecars.rss_mib(r) for r in range(W)]
        growth = [rss_end[r] - rss_base[r] for r in range(W)]
        faulty = [f for f in self.rounds if "heal_s" in f]  # each fault's first round
        heals = [f["heal_s"] for f in faulty if f.get("healed", True) and f["crossed"]]
        by_kind = {}
        for f in faulty:
            entry = by_kind.setdefault(f["fault"], {"faults": 0, "split": 0, "not_crossed": 0})
            entry["faults"] += 1
            entry["split"] += f["split"]
            entry["not_crossed"] += not f["crossed"]
        recovered = 0
        for r in range(W):
            with open(self.sidecars.logs[r]) as log:
                recovered += sum(
                    "took the agreed result its peers finished" in line for line in log
                )
        summary = {
            "world_size": W,
            "collective_timeout_s": self.T,
            "rounds": len(self.rounds),
            "faults": by_kind,
            "split_rounds_healed": sum(f["split"] for f in self.rounds),  # any round
            "rounds_left_split": sum(1 for f in self.rounds if not f["ok"]),
            "faults_not_healed": sum(1 for f in faulty if not f.get("healed", True)),
            "faults_crossed_by_no_round": sum(1 for f in faulty if not f["crossed"]),
            "rounds_recovered_from_peers": recovered,
            "resends": sum(f["resends"] for f in self.rounds),
            "heal_s_median": statistics.median(heals) if heals else None,
            "heal_s_max": max(heals) if heals else None,
            "round_s_median": round_time,
            "rss_mib_start": rss_start,
            "rss_mib_end": rss_end,
            "rss_growth_mib_max": max(growth),  # since the warm-up or the latest restart
            "failures": self.failures,
        }
        if max(growth) > self.args.max_growth_mib:
            self.fail(f"a sidecar's memory grew {max(growth):.1f} MiB")
            summary["failures"] = self.failures
        return summary


def can_run():
    """None if namespaces and nftables work here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    probe = f"psprobe{os.getpid() % 100000}"
    try:
        sh("ip", "netns", "add", probe)
        try:
            sh("ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe")
        finally:
            sh("ip", "netns", "del", probe, check=False)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="packsched-server binary")
    parser.add_argument("--short", action="store_true", help="the test command's form")
    parser.add_argument("--long", action="store_true", help="the benchmark's form")
    parser.add_argument("--world_size", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1.5, help="--collective_timeout, s")
    parser.add_argument("--margin", type=float, default=2.0, help="allowed past the timeout, s")
    parser.add_argument("--one_way_cuts", type=int, default=2)
    parser.add_argument(
        "--non_partner_cuts", type=int, default=1, help="one-way cuts no round crosses"
    )
    parser.add_argument("--cuts", type=int, default=1)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--stops", type=int, default=1)
    parser.add_argument("--slows", type=int, default=1)
    parser.add_argument("--clean_between", type=int, default=1, help="at least 1")
    parser.add_argument("--sequences", type=int, default=6000, help="per rank and round, about")
    parser.add_argument("--round_budget", type=float, default=40.0, help="resends for, s")
    parser.add_argument("--max_growth_mib", type=float, default=64.0)
    parser.add_argument("--max_rounds_per_fault", type=int, default=12)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--max_seconds", type=float, default=600.0)
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args()
    if args.long:
        args.one_way_cuts, args.cuts, args.kills, args.stops, args.slows = 25, 25, 50, 10, 5
        args.non_partner_cuts = 0  # among the 25 random one-way cuts
        args.max_seconds = max(args.max_seconds, 3000.0)
    why = can_run()
    if why is not None:
        print(f"fault_suite: SKIPPED: network namespaces with nftables are not usable here ({why})")
        return SKIP
    import tempfile

    from packsched import SchedulerClient

    def out_of_time(*_):
        raise TimeoutError(f"fault_suite ran past --max_seconds={args.max_seconds:g}")

    def stopped(signum, _):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt(f"fault_suite stopped by signal {signum}")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    signal.alarm(int(args.max_seconds))
    net = sidecars = None
    clients = []
    with tempfile.TemporaryDirectory(prefix="packsched-fault-") as workdir:
        try:
            # A private copy: a rebuild of the original during the run cannot change what restarts.
            server = os.path.join(workdir, "packsched-server")
            shutil.copy2(args.server, server)
            net = Net(args.world_size)
            sidecars = Sidecars(server, net, args.world_size, args.timeout, workdir)
            clients = [
                SchedulerClient(sidecars.target(r), timeout=4 * args.timeout + 20)
                for r in range(args.world_size)
            ]
            suite = Suite(args, net, sidecars, clients)
            started = time.monotonic()
            summary = suite.run()
            summary["seconds"] = time.monotonic() - started
            if suite.failures:
                for r in range(args.world_size):
                    print(f"--- rank {r} log tail:\n{sidecars.tail(r)}")
        finally:
            signal.alarm(0)
            for client in clients:
                client.close()
            if sidecars is not None:
                sidecars.close()
            if net is not None:
                net.close()
    text = json.dumps(summary, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
