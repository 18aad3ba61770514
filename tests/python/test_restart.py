"""A trainer killed at step S and resumed from its checkpoint at step S - 2 against the same
running sidecars (2 ranks, real processes): the replayed steps get the plans they had when the
data is the same; with other data every rank gets an error that names the restart and the way
out, and a new epoch of the stream (a new stream name) plans them."""

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys

import packsched
from packsched.client import SchedulerClient
from sidecar import start_group

TRAINER = pathlib.Path(__file__).resolve().parent / "helpers" / "restart_trainer.py"
PACKAGE_DIR = pathlib.Path(packsched.__file__).resolve().parents[1]
KILLED_AT = 4


def start_trainer(targets, first, last, data, stream, stall_at=None):
    """One process per rank; returns the Popens in rank order."""
    extra = [] if stall_at is None else ["--stall_at", str(stall_at)]
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_DIR))
    return [
        subprocess.Popen(
            [sys.executable, str(TRAINER), target, str(rank), str(first), str(last), data, stream]
            + extra,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank, target in enumerate(targets)
    ]


def lines_of(proc, timeout=120):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, [json.loads(line) for line in out.splitlines()]


def run_until_killed(targets, data, stream):
    """Steps 0 .. KILLED_AT - 1 done, every rank at the start of step KILLED_AT: then every
    trainer process is killed. Returns each rank's plans by step."""
    procs = start_trainer(targets, 0, 100, data, stream, stall_at=KILLED_AT)
    plans = [{} for _ in procs]
    try:
        for rank, proc in enumerate(procs):
            for line in proc.stdout:
                record = json.loads(line)
                if "plans" in record:
                    plans[rank][record["step"]] = record["plans"]
                elif record.get("stalled") == KILLED_AT:
                    break
                else:
                    raise AssertionError(f"rank {rank}: {record}")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert [sorted(p) for p in plans] == [list(range(KILLED_AT))] * 2
    return plans


def status(target):
    with SchedulerClient(target) as client:
        return client.status()


def streams(target):
    return {st["name"]: st for st in status(target)["streams"]}


def served(target):
    """(rounds the stream 'verl' computed, Plan calls served from the cache of finished rounds)."""
    return (
        int(streams(target)["verl"].get("rounds_completed", 0)),
        int(status(target)["counters"].get("cache_hits", 0)),
    )


def test_a_resumed_trainer_gets_its_plans_again_or_is_told_to_start_a_new_epoch(tmp_path):
    with contextlib.ExitStack() as stack:
        group = [
            stack.enter_context(s) for s in start_group(tmp_path, 2, "--collective_timeout=10s")
        ]
        targets = [s.target for s in group]
        before = run_until_killed(targets, "data-a", "verl")
        assert [served(t) for t in targets] == [(2 * KILLED_AT, 0)] * 2  # 2 calls a step

        # Resumed from the checkpoint of step KILLED_AT - 2, same data: the replayed steps get
        # the plans they had, from the sidecars' cache; then the run goes on past the kill.
        resumed = [
            lines_of(p)
            for p in start_trainer(targets, KILLED_AT - 2, KILLED_AT + 2, "data-a", "verl")
        ]
        for rank, (code, records) in enumerate(resumed):
            assert code == 0, records
            by_step = {r["step"]: r["plans"] for r in records}
            assert sorted(by_step) == list(range(KILLED_AT - 2, KILLED_AT + 2))
            for step in (KILLED_AT - 2, KILLED_AT - 1):
                assert by_step[step] == before[rank][step], (rank, step)
        # The 2 replayed steps came from the cache; only the 2 new ones were computed.
        assert [served(t) for t in targets] == [(2 * KILLED_AT + 4, 4)] * 2

        # Resumed again from the same checkpoint with other data (a reshuffled stream): every
        # rank's first replayed round is refused, naming the restart and the way out.
        refused = [
            lines_of(p)
            for p in start_trainer(targets, KILLED_AT - 2, KILLED_AT + 2, "data-b", "verl")
        ]
        for code, records in refused:
            assert code == 3
            (failure,) = records
            assert failure["step"] == KILLED_AT - 2
            assert failure["code"] == "FAILED_PRECONDITION"
            assert f"round {(KILLED_AT - 2) * 1000} is already finished" in failure["message"]
            assert "restarted from a checkpoint" in failure["message"]
            assert "start a new epoch of the stream" in failure["message"]

        # The way out: a new epoch of the stream, the same on every rank.
        fresh = [
            lines_of(p)
            for p in start_trainer(targets, KILLED_AT - 2, KILLED_AT + 2, "data-b", "verl@1")
        ]
        plans = []
        for code, records in fresh:
            assert code == 0, records
            assert [r["step"] for r in records] == list(range(KILLED_AT - 2, KILLED_AT + 2))
            plans.append([r["plans"] for r in records])
        for step_a, step_b in zip(*plans):  # the ranks agreed every count
            assert [len(call) for call in step_a] == [len(call) for call in step_b]
        assert int(streams(targets[0])["verl@1"]["last_round"]) == (KILLED_AT + 1) * 1000 + 1
