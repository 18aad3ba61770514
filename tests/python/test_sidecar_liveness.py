"""Nothing stalls the sidecar: heavy BalanceBatch requests run on its own planning workers (health
and Plan keep answering), and planning stops at the caller's deadline, at its cancellation and at
SIGTERM. Real packsched-server processes on loopback."""

import random
import time

import grpc
import pytest

from packsched.v1 import scheduler_pb2, scheduler_pb2_grpc
from sidecar import Sidecar

# BalanceBatch requests slot by slot (sync "micro_batch") over n = 100,000 sequences of 50 to
# 4,000 tokens: over W = 10 ranks (about 6 s of planning on the 2-core VM, an estimate of 54 MiB:
# four fit the default memory budget together), and over W = 4 (about 36 s, far longer than any
# deadline below). Each test checks that they are still running when it measures: should the
# planner get much faster, they fail rather than pass without measuring.
LIVENESS_SHAPE = (100_000, 10)
STOP_SHAPE = (100_000, 4)
# Health and a small Plan must answer within this while heavy requests run (p99).
LIVENESS_BUDGET_S = 0.100
# Planning must stop within this of its deadline / cancellation: the CPU the process burns in a
# window that starts this long after the event must be near zero.
STOP_WITHIN_S = 0.100

HEALTH = "/grpc.health.v1.Health/Check"
SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}


def heavy_request(shape=STOP_SHAPE):
    n, world_size = shape
    rng = random.Random(1)
    return scheduler_pb2.BalanceBatchRequest(
        lengths=[rng.randint(50, 4000) for _ in range(n)],
        world_size=world_size,
        sync=scheduler_pb2.SYNC_MICRO_BATCH,
        options=scheduler_pb2.PlanOptions(max_token_len=4096),
    )


def small_plan():
    return scheduler_pb2.PlanRequest(
        lengths=[100, 200, 300, 400],
        options=scheduler_pb2.PlanOptions(max_token_len=1024),
        stream="liveness",
    )


def channel_of(sidecar):
    return grpc.insecure_channel(
        sidecar.target,
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    )


def idle_cpu(sidecar, after, window=0.5):
    """CPU seconds the sidecar burns in [after + STOP_WITHIN_S, + window] (`after`: monotonic)."""
    time.sleep(max(0.0, after + STOP_WITHIN_S - time.monotonic()))
    before = sidecar.cpu_seconds()
    time.sleep(window)
    return sidecar.cpu_seconds() - before


def busy_cpu(sidecar, window=0.3):
    before = sidecar.cpu_seconds()
    time.sleep(window)
    return sidecar.cpu_seconds() - before


@pytest.fixture
def sidecar(tmp_path):
    with Sidecar(tmp_path, "--planning_threads=1") as s:
        yield s


def test_health_and_plan_answer_while_heavy_balance_batches_run(tmp_path, record_property):
    # The default workers (half the cores) and budget.
    with Sidecar(tmp_path) as sidecar, channel_of(sidecar) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        health = channel.unary_unary(HEALTH)
        assert health(b"", timeout=5) == SERVING
        stub.Plan(small_plan(), timeout=5)  # the stream exists before the clock starts
        heavy = [
            stub.BalanceBatch.future(heavy_request(LIVENESS_SHAPE), timeout=60) for _ in range(4)
        ]
        try:
            assert busy_cpu(sidecar) > 0.1, "the heavy requests are not running"
            latencies = []
            # Probes while the last heavy request runs (at most 3 s: the bound is what matters).
            end = time.monotonic() + 3.0
            while time.monotonic() < end and not heavy[-1].done():
                start = time.monotonic()
                assert health(b"", timeout=5) == SERVING
                stub.Plan(small_plan(), timeout=5)
                latencies.append(time.monotonic() - start)
                time.sleep(0.01)
            for f in heavy:
                assert not f.done() or f.code() == grpc.StatusCode.OK, f.details()
        finally:
            for f in heavy:
                f.cancel()
    assert len(latencies) >= 20, "the heavy requests ended before the probes could measure"
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    record_property("health_and_plan_p99_ms", round(p99 * 1000, 1))
    print(
        f"health + small Plan under 4 heavy BalanceBatch: p99 {p99 * 1000:.1f} ms "
        f"over {len(latencies)} probes"
    )
    assert p99 < LIVENESS_BUDGET_S


def test_full_queue_is_refused_with_a_message(tmp_path):
    # Three fit the default memory budget: the queue alone refuses the third.
    flags = ("--planning_threads=1", "--planning_queue=1")
    with Sidecar(tmp_path, *flags) as sidecar, channel_of(sidecar) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        running = stub.BalanceBatch.future(heavy_request(), timeout=10)
        assert busy_cpu(sidecar) > 0.1
        queued = stub.BalanceBatch.future(heavy_request(), timeout=10)
        time.sleep(0.3)
        try:
            with pytest.raises(grpc.RpcError) as refused:
                stub.BalanceBatch(heavy_request(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--planning_queue = 1" in refused.value.details()
        finally:
            running.cancel()
            queued.cancel()


def test_planning_stops_at_the_deadline(sidecar):
    with channel_of(sidecar) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        deadline = time.monotonic() + 1.0
        with pytest.raises(grpc.RpcError) as late:
            stub.BalanceBatch(heavy_request(), timeout=1.0)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert idle_cpu(sidecar, deadline) < 0.05
        # The worker is free again: a small request is answered at once.
        small = scheduler_pb2.BalanceBatchRequest(
            lengths=[100] * 8, world_size=2, options=scheduler_pb2.PlanOptions(max_token_len=1024)
        )
        assert len(stub.BalanceBatch(small, timeout=2).ranks) == 2


def test_an_expired_deadline_is_counted_as_deadline_exceeded(tmp_path):
    """A call that ran past its deadline, and one that waited in the queue past it, are both
    DEADLINE_EXCEEDED in the sidecar's counters (gRPC also marks them cancelled)."""
    flags = ("--planning_threads=1", "--planning_queue=1")
    with Sidecar(tmp_path, *flags) as sidecar, channel_of(sidecar) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        running = stub.BalanceBatch.future(heavy_request(), timeout=1.5)
        assert busy_cpu(sidecar) > 0.1
        queued = stub.BalanceBatch.future(heavy_request(), timeout=0.5)
        for call in (queued, running):
            with pytest.raises(grpc.RpcError) as late:
                call.result()
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The queued one is answered when the worker takes it, after the running one stopped.
        deadline = time.monotonic() + 5
        while True:
            status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=2)
            errors = dict(status.counters.errors_by_code)
            if sum(errors.values()) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert errors == {"DEADLINE_EXCEEDED": 2}


def test_planning_stops_when_the_caller_cancels(sidecar):
    with channel_of(sidecar) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        call = stub.BalanceBatch.future(heavy_request(), timeout=30)
        assert busy_cpu(sidecar) > 0.1
        call.cancel()
        cancelled = time.monotonic()
        assert idle_cpu(sidecar, cancelled) < 0.05


def test_planning_stops_at_sigterm_within_the_grace(tmp_path):
    # A long grace: the sidecar must exit long before it, its planning stopped.
    sidecar = Sidecar(tmp_path, "--planning_threads=1", "--shutdown_grace=20s")
    try:
        with channel_of(sidecar) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            call = stub.BalanceBatch.future(heavy_request(), timeout=60)
            assert busy_cpu(sidecar) > 0.1
            start = time.monotonic()
            assert sidecar.terminate(timeout=10) == 0  # SIGTERM
            took = time.monotonic() - start
            with pytest.raises(grpc.RpcError) as stopped:
                call.result(timeout=5)
            assert stopped.value.code() == grpc.StatusCode.UNAVAILABLE
            assert took < 2.0, f"the sidecar took {took:.2f} s to exit after SIGTERM"
    finally:
        sidecar.stop()
