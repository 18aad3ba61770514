"""The sidecar's Prometheus metrics end to end: a rank group of 2 real sidecars over Gloo, each
serving /metrics on loopback, scraped by a real Prometheus server (Debian's `prometheus`,
started here on loopback with a generated config and a temporary storage folder, and stopped by
pid). The test runs rounds (successful ones, one failed by a rank's bad input, one failed by an
options mismatch, a cache hit and GetStatus calls) and checks through Prometheus' HTTP query API
that the counters and histogram counts equal what it did; `promtool check metrics` passes on the
exposition; a reclaimed stream's series go. A second test asks Prometheus each token panel of
the Grafana dashboard (deploy/grafana) after a flat and a forest round through one sidecar.
Skipped only where the prometheus package is absent (deploy/install-deps.sh installs it)."""

import json
import pathlib
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

from packsched.client import SchedulerClient, SchedulerError
from packsched.tree import forest_from_groups
from sidecar import Sidecar, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "deploy/grafana/packsched-dashboard.json"

pytestmark = pytest.mark.skipif(
    not pathlib.Path(PROMETHEUS).exists(),
    reason="Prometheus is not installed (apt-get install prometheus; deploy/install-deps.sh)",
)

CAP = 4096
ROUNDS = 4  # successful rounds on stream "s"


def wait_for_file(path, seconds=20):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {seconds} s"
        time.sleep(0.01)
    return int(path.read_text())


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class Prometheus:
    """A Prometheus server on loopback scraping `targets` every second; stopped by pid."""

    def __init__(self, workdir, targets):
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: packsched\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        self.log = open(workdir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, f"prometheus exited: {self.proc.returncode}"
            try:
                http_get(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
                return
            except OSError:
                assert time.monotonic() < deadline, "prometheus not ready within 30 s"
                time.sleep(0.1)

    def query(self, expr, label="instance", at=None):
        """{the series' `label`: value} of an instant query (at Unix time `at`, default now)."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(params)
        body = json.loads(http_get(url))
        assert body["status"] == "success", body
        return {r["metric"].get(label): float(r["value"][1]) for r in body["data"]["result"]}

    def query_all(self, expr):
        """Every series of an instant query (its labels and value)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        body = json.loads(http_get(url))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def group(tmp_path):
    """Two sidecars (a rank group over Gloo) with metrics on loopback port 0: (sidecar, metrics
    address) per rank."""
    rendezvous = f"127.0.0.1:{free_port()}"
    started = []
    try:
        for rank in range(2):
            port_file = tmp_path / f"metrics-port-{rank}"
            sidecar = Sidecar(
                tmp_path,
                f"--rank={rank}",
                "--world_size=2",
                f"--rendezvous={rendezvous}",
                "--backend=gloo",
                "--collective_timeout=10s",
                "--stream_idle_timeout=15s",
                "--metrics_listen=127.0.0.1:0",
                f"--metrics_port_file={port_file}",
            )
            started.append([sidecar, None])
            started[-1][1] = f"127.0.0.1:{wait_for_file(port_file)}"
        yield started
    finally:
        for sidecar, _ in started:
            sidecar.stop()


def on_every_rank(clients, call):
    """call(rank, client) on every rank at once; the results (or raised errors) by rank."""
    results = [None] * len(clients)

    def run(rank):
        try:
            results[rank] = call(rank, clients[rank])
        except SchedulerError as e:
            results[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a call did not return within 60 s"
    return results


def test_prometheus_sees_what_the_sidecars_did(group, tmp_path):
    rng = np.random.default_rng(22)
    clients = [SchedulerClient(sidecar.target, timeout=30) for sidecar, _ in group]
    instances = [address for _, address in group]
    expected_k = [0, 0]
    expected_sequences = [0, 0]
    batches = {}
    for rnd in range(ROUNDS):
        batches[rnd] = [
            rng.integers(1, CAP, size=int(rng.integers(20, 200))).tolist() for _ in group
        ]
        plans = on_every_rank(clients, lambda r, c: c.plan(rnd, batches[rnd][r], CAP, stream="s"))
        for rank, plan in enumerate(plans):
            assert not isinstance(plan, Exception), plan
            expected_k[rank] += plan.num_micro_batches
            expected_sequences[rank] += len(batches[rnd][rank])
    # A caller of a finished round: served from rank 0's cache, not run again.
    clients[0].plan(ROUNDS - 1, batches[ROUNDS - 1][0], CAP, stream="s")
    # A round failed by rank 1's bad input (a length of 0): INVALID_ARGUMENT on both ranks.
    bad = on_every_rank(
        clients, lambda r, c: c.plan(ROUNDS, [5, 0, 7] if r == 1 else [5, 6, 7], CAP, stream="s")
    )
    assert [e.code for e in bad] == ["INVALID_ARGUMENT"] * 2, bad
    # A round whose ranks disagree on the options: FAILED_PRECONDITION, a peer failure.
    mismatch = on_every_rank(
        clients, lambda r, c: c.plan(ROUNDS + 1, [5, 6, 7], CAP + r, stream="s")
    )
    assert [e.code for e in mismatch] == ["FAILED_PRECONDITION"] * 2, mismatch
    for client in clients:
        client.status()

    # The exposition passes promtool's checks (format and naming lint).
    exposition = http_get(f"http://{instances[0]}/metrics")
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f'packsched_stream_last_round{{stream="s"}} {ROUNDS - 1}' in exposition

    prometheus = Prometheus(tmp_path, instances)
    try:
        expected = {
            'packsched_rounds_total{outcome="OK"}': [ROUNDS, ROUNDS],
            'packsched_rounds_total{outcome="INVALID_ARGUMENT"}': [1, 1],
            'packsched_rounds_total{outcome="FAILED_PRECONDITION"}': [1, 1],
            'packsched_round_duration_seconds_count{phase="whole"}': [ROUNDS + 2] * 2,
            'packsched_round_duration_seconds_count{phase="wait"}': [ROUNDS, ROUNDS],
            'packsched_round_duration_seconds_count{phase="partition"}': [ROUNDS, ROUNDS],
            'packsched_requests_total{method="Plan",code="OK"}': [ROUNDS + 1, ROUNDS],
            'packsched_requests_total{method="Plan",code="INVALID_ARGUMENT"}': [1, 1],
            'packsched_requests_total{method="Plan",code="FAILED_PRECONDITION"}': [1, 1],
            'packsched_requests_total{method="GetStatus",code="OK"}': [1, 1],
            'packsched_group_peer_failures_total{cause="mismatch"}': [1, 1],
            'packsched_group_peer_failures_total{cause="deadline"}': [0, 0],
            "packsched_group_formation_seconds_count": [1, 1],
            "packsched_plan_micro_batches_sum": expected_k,
            "packsched_plan_micro_batches_count": [ROUNDS, ROUNDS],
            "packsched_plan_sequences_total": expected_sequences,
            'packsched_plan_over_cap_micro_batches_total{kind="avoidable"}': [0, 0],
            "packsched_cache_hits_total": [1, 0],
            "packsched_group_world_size": [2, 2],
            "packsched_group_ready": [1, 1],
            'packsched_group_backend_info{backend="gloo"}': [1, 1],
            "packsched_rounds_in_flight": [0, 0],
            "packsched_rounds_queued": [0, 0],
        }
        deadline = time.monotonic() + 30
        while True:
            seen = {}
            for expr in expected:
                values = prometheus.query(expr)
                seen[expr] = [values.get(instance) for instance in instances]
            if seen == expected or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert seen == expected
        cpu = prometheus.query("process_cpu_seconds_total")
        assert all(cpu.get(i, 0) > 0 for i in instances), cpu
        rss = prometheus.query("process_resident_memory_bytes")
        assert all(rss.get(i, 0) > 1 << 20 for i in instances), rss
    finally:
        prometheus.stop()
    assert prometheus.proc.returncode is not None

    # The stream goes idle (--stream_idle_timeout=15s) and is reclaimed: its series go.
    deadline = time.monotonic() + 40
    while 'stream="s"' in http_get(f"http://{instances[1]}/metrics"):
        assert time.monotonic() < deadline, "the reclaimed stream's series are still exported"
        time.sleep(0.2)
    for client in clients:
        client.close()


def panel_exprs(title_start):
    """The expressions of the Grafana dashboard's panel whose title starts with ``title_start``,
    for the test's Prometheus: the `job` variable is its job, $__rate_interval a window that
    holds every sample of the test."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["title"].startswith(title_start)]
    assert len(panels) == 1, f"no single dashboard panel titled {title_start!r}"
    return [
        t["expr"].replace("$job", "packsched").replace("$__rate_interval", "10m")
        for t in panels[0]["targets"]
    ]


def tree_forwarded(plan, forest):
    """Real tokens a tree plan forwards, from its layouts: per piece, every node on the paths of
    the piece's rollouts once."""
    total = 0
    for part in plan.micro_batches:
        begin = part.piece_rollout_begin
        for b in range(len(begin) - 1):
            nodes = set()
            for rollout in part.piece_rollouts[begin[b] : begin[b + 1]]:
                node = int(forest.rollout_leaf[rollout])
                while node >= 0 and node not in nodes:
                    nodes.add(node)
                    node = int(forest.node_parent[node])
            total += sum(int(forest.node_len[n]) for n in nodes)
    return total


def test_dashboard_token_panels_show_what_the_plans_imply(tmp_path):
    """A flat round and a forest round (streams "flat" and "forest") through a real sidecar;
    each token panel of the dashboard, asked of Prometheus, gives per stream what the plans
    imply, computed here from the inputs and the plans' micro-batches. Each stream first runs
    the same round once before Prometheus scrapes, so that the counters' first samples hold it
    and rate() over the window sees the second round alone, with one extrapolation for every
    series: one sidecar (one scrape timestamp for all of them), whose first samples equal
    their increases (rate() does not clip any of them at a zero point)."""
    rng = np.random.default_rng(31)
    port_file = tmp_path / "metrics-port"
    sidecar = Sidecar(tmp_path, "--metrics_listen=127.0.0.1:0", f"--metrics_port_file={port_file}")
    try:
        check_token_panels(rng, sidecar, f"127.0.0.1:{wait_for_file(port_file)}", tmp_path)
    finally:
        sidecar.stop()


def check_token_panels(rng, sidecar, instance, tmp_path):
    clients = [SchedulerClient(sidecar.target, timeout=30)]
    instances = [instance]
    align = 64
    flat = [rng.integers(100, 3000, size=int(rng.integers(30, 60))).tolist() for _ in clients]
    flat_loss = [[int(rng.integers(0, n + 1)) for n in lengths] for lengths in flat]
    forests, forest_loss = [], []
    for _ in clients:
        groups = int(rng.integers(3, 6))
        forest = forest_from_groups(
            rng.integers(200, 1500, size=groups),
            [rng.integers(50, 900, size=int(rng.integers(4, 9))) for _ in range(groups)],
        )
        forests.append(forest)
        forest_loss.append(
            [int(rng.integers(0, n + 1)) for n in forest.rollout_len.tolist()]  # per rollout
        )

    def run(rnd, stream):
        inputs, loss_tokens = (flat, flat_loss) if stream == "flat" else (forests, forest_loss)
        plans = on_every_rank(
            clients,
            lambda r, c: c.plan(
                rnd, inputs[r], CAP, stream=stream, loss_tokens=loss_tokens[r], align_to=align
            ),
        )
        for plan in plans:
            assert not isinstance(plan, Exception), plan
        return plans

    for stream in ("flat", "forest"):
        run(0, stream)
    prometheus = Prometheus(tmp_path, instances)
    try:
        # Two scrapes of every token series (2 streams x 4 kinds) before the second
        # round (the scrape manager starts a few seconds after /-/ready).
        held = [
            f"count_over_time(packsched_stream_{kind}_tokens_total[10m]) >= 2"
            for kind in ("logical", "executed", "forwarded", "loss")
        ]
        deadline = time.monotonic() + 30
        while sum(len(prometheus.query_all(expr)) for expr in held) < 8:
            assert time.monotonic() < deadline, "Prometheus did not scrape the first round"
            time.sleep(0.2)
        plans = {stream: run(1, stream) for stream in ("flat", "forest")}

        # What the plans imply, summed over the ranks (the panels sum by stream).
        logical = {
            "flat": sum(sum(lengths) for lengths in flat),
            "forest": sum(int(f.rollout_len.sum()) for f in forests),
        }
        executed = {
            "flat": sum(m.total for plan in plans["flat"] for m in plan.metadata),
            "forest": sum(p.meta.total for plan in plans["forest"] for p in plan.micro_batches),
        }
        forwarded = {
            "flat": logical["flat"],
            "forest": sum(tree_forwarded(p, f) for p, f in zip(plans["forest"], forests)),
        }
        loss = {"flat": sum(map(sum, flat_loss)), "forest": sum(map(sum, forest_loss))}
        assert forwarded["forest"] < logical["forest"], "the forests share no prefix"
        assert executed["flat"] > logical["flat"], "align_to left no padding to see"
        expected = {
            "Tree token ratio": [{s: forwarded[s] / logical[s] for s in plans}],
            "Padding share": [{s: (executed[s] - forwarded[s]) / executed[s] for s in plans}],
            "Loss-bearing share": [{s: loss[s] / logical[s] for s in plans}],
        }
        kinds = {"logical": logical, "executed": executed, "forwarded": forwarded, "loss": loss}
        rates = panel_exprs("Tokens per second")
        assert len(rates) == len(kinds)

        def seen_now():
            """Every panel's answer at one instant (rate()'s window ends there)."""
            at = time.time()
            seen = {
                t: [prometheus.query(e, "stream", at) for e in panel_exprs(t)] for t in expected
            }
            seen["Tokens per second"] = [prometheus.query(e, "stream", at) for e in rates]
            return seen

        def close(a, b):
            return a is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))

        def matches(seen):
            for title, targets in expected.items():
                for want, got in zip(targets, seen[title]):
                    if set(got) != set(want) or not all(close(got[s], want[s]) for s in want):
                        return False
            # Tokens per second: every kind's rate is the same multiple of its increase (one
            # window, one extrapolation), so the kinds stand as the plans' figures do.
            for s in plans:
                got = [r.get(s) for r in seen["Tokens per second"]]
                if None in got or not got[0] > 0:
                    return False
                per_token = got[0] / logical[s]
                want = [kinds[k][s] * per_token for k in kinds]
                if not all(close(g, w) for g, w in zip(got, want)):
                    return False
            return True

        deadline = time.monotonic() + 30
        seen = seen_now()
        while not matches(seen) and time.monotonic() < deadline:
            time.sleep(0.5)
            seen = seen_now()
        assert matches(seen), f"Prometheus: {seen}; the plans: {expected}, kinds {kinds}"
    finally:
        prometheus.stop()
    for client in clients:
        client.close()
