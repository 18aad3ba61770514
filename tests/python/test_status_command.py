"""`packsched-server --status=HOST:PORT` against a real rank group of 2 (Gloo on loopback): the
JSON (--status_json) carries what GetStatus says (snake_case keys, numbers as numbers), the
table shows the group, the stream and the micro-batches over the cap (unavoidable apart from
avoidable), the configured backend is reported before any round, and a sidecar that is not there
is exit 1."""

import contextlib
import json
import subprocess
import threading

from packsched.client import SchedulerClient
from sidecar import SERVER, start_group, free_port


def status(target, *flags):
    return subprocess.run(
        [str(SERVER), f"--status={target}", *flags], capture_output=True, text=True, timeout=30
    )


def test_status_table_and_json(tmp_path):
    with contextlib.ExitStack() as stack:
        group = start_group(tmp_path, 2, "--collective_timeout=10s")
        for sidecar in group:
            stack.callback(sidecar.stop)
        clients = [SchedulerClient(s.target, timeout=30) for s in group]
        for client in clients:
            stack.callback(client.close)
        # Before any round the configured backend is reported, not "local".
        before = status(group[1].target, "--status_json")
        assert before.returncode == 0, before.stderr
        assert json.loads(before.stdout)["backend"] == "gloo"
        assert "backend gloo" in status(group[0].target).stdout
        # Round 4 holds a sequence longer than the cap on each rank (overlong="isolate"): one
        # micro-batch isolates it, over the cap but unavoidable.
        for rnd, last in ((3, 300), (4, 3000)):
            threads = [
                threading.Thread(
                    target=c.plan,
                    args=(rnd, [100, 200, last + r], 1024),
                    kwargs={"overlong": "isolate"},
                )
                for r, c in enumerate(clients)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)

        done = status(group[1].target, "--status_json")
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        expected = clients[1].status()
        # The proto's own field names; integers are JSON numbers, not strings.
        assert got["rank"] == int(expected["rank"]) == 1
        assert got["world_size"] == 2 and isinstance(got["world_size"], int)
        assert got["backend"] == "gloo" and got["group_ready"] is True
        [stream] = got["streams"]
        assert stream["name"] == "default"
        assert stream["last_round"] == 4
        assert stream["rounds_completed"] == 2
        assert isinstance(stream["last_round_duration_us"], int)
        assert stream["last_round_duration_us"] > 0
        assert got["counters"]["rounds"] == 2 and got["counters"]["errors_by_code"] == {}
        assert got["counters"]["over_cap_parts"] == 1
        assert got["counters"]["over_cap_unavoidable_parts"] == 1
        assert got["counters"]["over_cap_avoidable_parts"] == 0
        assert isinstance(got["uptime_us"], int)
        assert not any(key != key.lower() for key in got), got.keys()

        table = status(group[0].target)
        assert table.returncode == 0, table.stderr
        assert "rank 0 of 2, backend gloo" in table.stdout
        assert "1 micro-batches: 1 unavoidable (one overlong sequence each), 0 avoidable\n" in (
            table.stdout
        )
        assert any(
            line.split()[:4] == ["default", "4", "2", "0"] for line in table.stdout.splitlines()
        ), table.stdout

    gone = status(f"127.0.0.1:{free_port()}")
    assert gone.returncode == 1 and "--status" in gone.stderr
