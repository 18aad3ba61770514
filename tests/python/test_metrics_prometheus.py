"""The sidecar's Prometheus metrics end to end: a rank group of 2 real sidecars over Gloo, each
serving /metrics on loopback, scraped by a real Prometheus server (Debian's `prometheus`,
started here on loopback with a generated config and a temporary storage folder, and stopped by
pid). The test runs rounds (successful ones, one failed by a rank's bad input, one failed by an
options mismatch, a cache hit and GetStatus calls) and checks through Prometheus' HTTP query API
that the counters and histogram counts equal what it did; `promtool check metrics` passes on the
exposition; a reclaimed stream's series go. Skipped only where the prometheus package is absent
(deploy/install-deps.sh installs it)."""

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
from sidecar import Sidecar, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

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

    def query(self, expr):
        """{instance: value} of an instant query."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        body = json.loads(http_get(url))
        assert body["status"] == "success", body
        return {r["metric"].get("instance"): float(r["value"][1]) for r in body["data"]["result"]}

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
