"""packsched.client.SchedulerClient against the real packsched-server (a group of one)."""

import dataclasses
import math
import socket
import threading
import time

import numpy as np
import pytest

from packsched import planner
from packsched.client import SchedulerClient, SchedulerError
from sidecar import Sidecar


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    with Sidecar(tmp_path_factory.mktemp("sidecar"), "--max_sequences_per_request=5000",
                 "--max_streams=16") as s:
        yield s


@pytest.fixture
def client(sidecar):
    with SchedulerClient(sidecar.target, timeout=10) as c:
        yield c


def lengths_of(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.lognormal(math.log(2000), 1.0, n).clip(50, 16000)).astype(np.int64).tolist()


def nan_safe(meta):
    """The micro-batch's fields, with a NaN loss_scale (weights that differ) made comparable."""
    fields = dataclasses.asdict(meta)
    if fields["loss_scale"] is not None and math.isnan(fields["loss_scale"]):
        fields["loss_scale"] = "nan"
    return fields


def same_plan(a, b):
    """Equal in everything but timings (the sidecar's are measured, the in-process plan's are 0)."""
    assert a.num_micro_batches == b.num_micro_batches
    assert a.local_num_micro_batches == b.local_num_micro_batches
    assert (a.micro_batches, a.reorder, a.revert, a.dropped) == (
        b.micro_batches, b.reorder, b.revert, b.dropped)
    assert [nan_safe(m) for m in a.metadata] == [nan_safe(m) for m in b.metadata]
    assert a.loss_weights == b.loss_weights
    assert a.global_counts == b.global_counts
    for field in ("num_sequences", "num_kept", "total_tokens", "total_cost", "max_part_cost",
                  "min_part_cost", "imbalance", "lower_bound_k", "over_cap_parts",
                  "naive_padded_tokens", "packed_tokens"):
        assert getattr(a.stats, field) == getattr(b.stats, field), field


def test_plan_equals_the_in_process_planner(client):
    lengths = lengths_of(1024, 1)
    loss_tokens = [max(0, x - 300) for x in lengths]
    options = dict(align_to=8, order="interleave", loss_tokens=loss_tokens,
                   loss_mode="sample_mean", dp_reduction="mean")
    remote = client.plan(1, lengths, 16384, stream="equal", **options)
    same_plan(remote, planner.plan_local(lengths, 16384, **options))
    assert remote.stats.cap == 16384
    assert remote.stats.local_ms > 0


def test_partition_and_balance_equal_the_in_process_planner(client):
    lengths = lengths_of(300, 2)
    same_plan(client.partition(lengths, 60, 20000), planner.partition(lengths, 60, 20000))
    remote = client.balance_batch(lengths, 4, 20000, group_ids=[i // 3 for i in range(300)])
    local = planner.balance(lengths, 4, 20000, group_ids=[i // 3 for i in range(300)])
    assert remote.num_micro_batches == local.num_micro_batches
    for r, l in zip(remote.ranks, local.ranks):
        assert r.indices == l.indices
        same_plan(r.plan, l.plan)


def test_callers_of_one_round_get_one_plan_and_a_cache_hit(client, sidecar):
    lengths = lengths_of(200, 3)
    before = client.status()["counters"]
    with SchedulerClient(sidecar.target) as tp_peer:
        first = client.plan(7, lengths, 16384, stream="tp")
        second = tp_peer.plan(7, lengths, 16384, stream="tp")
    same_plan(first, second)
    after = client.status()["counters"]
    assert int(after["cache_hits"]) == int(before["cache_hits"]) + 1


def test_the_same_round_with_other_content_is_failed_precondition(client):
    client.plan(1, [100, 200], 1000, stream="mismatch")
    with pytest.raises(SchedulerError) as e:
        client.plan(1, [100, 201], 1000, stream="mismatch")
    assert e.value.code == "FAILED_PRECONDITION"


@pytest.mark.parametrize("lengths,cap,options,code,text", [
    ([5, -3], 100, {}, "INVALID_ARGUMENT", "lengths[1]"),
    ([5, 3], 0, {}, "INVALID_ARGUMENT", "max_token_len"),
    ([], 100, {}, "INVALID_ARGUMENT", "lengths"),
    ([5, 3], 100, {"cap_mode": "wide"}, "INVALID_ARGUMENT", "cap_mode"),
    ([5, 300], 100, {}, "INVALID_ARGUMENT", "300"),
    ([5, 3], 100, {"loss_tokens": [1]}, "INVALID_ARGUMENT", "loss_tokens"),
    ([5, 3], 100, {"min_micro_batches": 10**12}, "INVALID_ARGUMENT", "min_micro_batches"),
    ([1] * 5001, 100, {}, "RESOURCE_EXHAUSTED", "5001"),
])
def test_bad_requests_raise_the_servers_error(client, lengths, cap, options, code, text):
    with pytest.raises(SchedulerError) as e:
        client.plan(1, lengths, cap, stream="errors", **options)
    assert e.value.code == code
    assert text in e.value.message


def test_a_failed_round_is_not_cached(client):
    with pytest.raises(SchedulerError):
        client.plan(3, [5, -1], 100, stream="retry")
    assert client.plan(3, [5, 1], 100, stream="retry").num_micro_batches == 1


def test_too_many_streams_is_resource_exhausted(tmp_path):
    with Sidecar(tmp_path, "--max_streams=2") as s, SchedulerClient(s.target) as c:
        c.plan(1, [5], 10, stream="a")
        c.plan(1, [5], 10, stream="b")
        with pytest.raises(SchedulerError) as e:
            c.plan(1, [5], 10, stream="c")
        assert e.value.code == "RESOURCE_EXHAUSTED"


def test_bearer_token(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    with Sidecar(tmp_path, f"--auth_token_file={token_file}") as s:
        with SchedulerClient(s.target) as anonymous:
            with pytest.raises(SchedulerError) as e:
                anonymous.plan(1, [5], 10)
            assert e.value.code == "UNAUTHENTICATED"
        with SchedulerClient(s.target, token="wrong") as wrong:
            with pytest.raises(SchedulerError) as e:
                wrong.plan(1, [5], 10)
            assert e.value.code == "UNAUTHENTICATED"
        with SchedulerClient(s.target, token="s3cret") as right:
            assert right.plan(1, [5], 10).num_micro_batches == 1


def test_waits_for_a_sidecar_that_starts_late(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = {}

    def call():
        with SchedulerClient(f"127.0.0.1:{port}", timeout=20) as c:
            result["plan"] = c.plan(1, [3, 4], 10)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.5)  # the call is already waiting for its sidecar
    with Sidecar(tmp_path, listen=f"127.0.0.1:{port}"):
        thread.join(timeout=20)
    assert result["plan"].num_micro_batches == 1


def test_an_unreachable_sidecar_fails_at_the_deadline():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    with SchedulerClient(f"127.0.0.1:{port}", timeout=0.5) as c:
        with pytest.raises(SchedulerError) as e:
            c.plan(1, [3], 10)
    assert e.value.code in ("DEADLINE_EXCEEDED", "UNAVAILABLE")
    assert time.monotonic() - start < 5


def test_status_reports_the_group_and_counters(client):
    status = client.status()
    assert status["world_size"] == "1" or status["world_size"] == 1
    assert status["group_ready"] is True
    assert status["backend"] == "local"
    assert int(status["proto_version"]) == 1
    assert "rounds" in status["counters"]


def test_the_error_and_client_are_exported_by_the_package():
    import packsched

    assert packsched.SchedulerError is SchedulerError
    assert packsched.SchedulerClient is SchedulerClient
