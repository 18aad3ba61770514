"""packsched.client.SchedulerClient against the real packsched-server (a group of one)."""

import dataclasses
import inspect
import math
import re
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from packsched import planner
from packsched.client import SchedulerClient, SchedulerError
from sidecar import SERVER, Sidecar, start_group


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    with Sidecar(
        tmp_path_factory.mktemp("sidecar"), "--max_sequences_per_request=5000", "--max_streams=16"
    ) as s:
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
        b.micro_batches,
        b.reorder,
        b.revert,
        b.dropped,
    )
    assert [nan_safe(m) for m in a.metadata] == [nan_safe(m) for m in b.metadata]
    assert a.loss_weights == b.loss_weights
    assert a.global_counts == b.global_counts
    for field in (
        "num_sequences",
        "num_kept",
        "total_tokens",
        "total_cost",
        "max_part_cost",
        "min_part_cost",
        "imbalance",
        "lower_bound_k",
        "over_cap_parts",
        "naive_padded_tokens",
        "packed_tokens",
    ):
        assert getattr(a.stats, field) == getattr(b.stats, field), field


def test_plan_equals_the_in_process_planner(client):
    lengths = lengths_of(1024, 1)
    loss_tokens = [max(0, x - 300) for x in lengths]
    options = dict(
        align_to=8,
        order="interleave",
        loss_tokens=loss_tokens,
        loss_mode="sample_mean",
        dp_reduction="mean",
    )
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
    # sync="micro_batch": the same plan and step as in-process.
    remote = client.balance_batch(lengths, 4, 20000, sync="micro_batch", micro_batch_cost=1000)
    local = planner.balance(lengths, 4, 20000, sync="micro_batch", micro_batch_cost=1000)
    assert remote.step == local.step
    for r, l in zip(remote.ranks, local.ranks):
        assert r.indices == l.indices
        same_plan(r.plan, l.plan)
    # The cost from a model's config.json, sent as the proto's ModelConfig: the same plan and step.
    qwen_like = {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "rope_theta": 1000000.0,  # a whole real: sent as an integer, not read
    }
    remote = client.balance_batch(lengths, 4, 20000, sync="micro_batch", model_config=qwen_like)
    local = planner.balance(lengths, 4, 20000, sync="micro_batch", model_config=qwen_like)
    assert remote.step == local.step
    assert remote.step != client.balance_batch(lengths, 4, 20000, sync="micro_batch").step
    for r, l in zip(remote.ranks, local.ranks):
        assert r.indices == l.indices
        same_plan(r.plan, l.plan)
    with pytest.raises(SchedulerError, match="model_config: .*hidden_size"):
        client.balance_batch(lengths, 4, 20000, model_config={"num_hidden_layers": 2})
    # Whole reals are integers (8.0 KV heads: GQA, as in-process); other reals are refused by the
    # sidecar, naming the field; a VLM's text_config is its language model.
    reals = dict(qwen_like, hidden_size=1536.0, num_key_value_heads=2.0)
    assert client.balance_batch(lengths, 4, 20000, sync="micro_batch", model_config=reals).step == (
        remote.step
    )
    vlm = {"model_type": "qwen2_vl", "hidden_size": 64, "text_config": qwen_like}
    assert client.balance_batch(lengths, 4, 20000, sync="micro_batch", model_config=vlm).step == (
        remote.step
    )
    with pytest.raises(SchedulerError, match="model_config: .*num_key_value_heads = 1.5"):
        client.balance_batch(
            lengths, 4, 20000, model_config=dict(qwen_like, num_key_value_heads=1.5)
        )
    with pytest.raises(SchedulerError, match="model_config: .*num_key_value_heads = 24"):
        client.balance_batch(
            lengths, 4, 20000, model_config=dict(qwen_like, num_key_value_heads=24)
        )


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


@pytest.mark.parametrize(
    "lengths,cap,options,code,text",
    [
        ([5, -3], 100, {}, "INVALID_ARGUMENT", "lengths[1]"),
        ([5, 3], 0, {}, "INVALID_ARGUMENT", "max_token_len"),
        ([5, 300], 100, {}, "INVALID_ARGUMENT", "300"),
        ([5, 3], 100, {"loss_tokens": [1]}, "INVALID_ARGUMENT", "loss_tokens"),
        ([5, 3], 100, {"min_micro_batches": 10**12}, "INVALID_ARGUMENT", "min_micro_batches"),
        ([1] * 5001, 100, {}, "RESOURCE_EXHAUSTED", "5001"),
    ],
)
def test_bad_requests_raise_the_servers_error(client, lengths, cap, options, code, text):
    with pytest.raises(SchedulerError) as e:
        client.plan(1, lengths, cap, stream="errors", **options)
    assert e.value.code == code
    assert text in e.value.message


def call_raw(target, method, body):
    """Sends `body` as the request bytes of Scheduler/`method`; returns the RpcError raised."""
    import grpc

    with grpc.insecure_channel(target) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            channel.unary_unary(f"/packsched.v1.Scheduler/{method}")(body, timeout=10)
    return raised.value


@pytest.mark.parametrize(
    "method", ["Plan", "Partition", "BalanceBatch", "GetStatus", "PlanDynamicCp"]
)
def test_a_body_that_does_not_parse_is_invalid_argument_naming_the_message(sidecar, method):
    error = call_raw(sidecar.target, method, b"\xff\xff\xff")  # not protobuf wire data
    assert error.code().name == "INVALID_ARGUMENT"
    assert f"not a valid packsched.v1.{method}Request" in error.details()
    assert dict(error.trailing_metadata())["packsched-served"] == "1"  # the sidecar's answer


def test_a_stream_name_that_is_not_utf8_is_invalid_argument(sidecar):
    error = call_raw(sidecar.target, "Plan", b"\x0a\x02\xc3\x28")  # field 1, `stream`
    assert error.code().name == "INVALID_ARGUMENT"
    assert "not valid UTF-8" in error.details()


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


def unused_target():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_an_unreachable_sidecar_fails_at_the_deadline_naming_target_and_wait():
    target = unused_target()
    start = time.monotonic()
    with SchedulerClient(target, timeout=0.5) as c:
        with pytest.raises(SchedulerError) as e:
            c.plan(1, [3], 10)
    assert e.value.code in ("DEADLINE_EXCEEDED", "UNAVAILABLE")
    assert time.monotonic() - start < 5
    assert target in e.value.message
    waited = float(re.search(r"after (\d+\.\d) s", e.value.message).group(1))
    assert 0.4 <= waited < 5
    assert "cannot be reached" in e.value.message


def server_default_collective_timeout_s():
    """The --collective_timeout default that packsched-server --helpfull prints (e.g. "1m")."""
    text = subprocess.run([str(SERVER), "--helpfull"], capture_output=True, text=True).stdout
    default = re.search(r"--collective_timeout .*?default: ([0-9hms.]+);", text, re.S).group(1)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(ms|h|m|s)", default))


def test_the_default_timeout_outlasts_the_servers_collective_timeout():
    # A round waits up to --collective_timeout for its peers, then fails with the message naming
    # the missing rank: only a caller that is still waiting hears it.
    collective = server_default_collective_timeout_s()
    default = inspect.signature(SchedulerClient).parameters["timeout"].default
    assert collective > 0
    assert default >= 1.5 * collective


def test_a_round_missing_a_rank_reports_the_rank_and_a_short_timeout_says_so(tmp_path):
    group = start_group(tmp_path, 2, "--collective_timeout=1s")
    try:
        with SchedulerClient(group[0].target) as patient:  # the default timeout
            with pytest.raises(SchedulerError) as e:
                patient.plan(1, [10, 20], 100, stream="alone")
        assert e.value.code == "DEADLINE_EXCEEDED"
        assert "ranks [1]" in e.value.message
        with SchedulerClient(group[0].target, timeout=0.5) as hasty:
            with pytest.raises(SchedulerError) as e:
                hasty.plan(2, [10, 20], 100, stream="alone")
        assert e.value.code == "DEADLINE_EXCEEDED"
        assert group[0].target in e.value.message
        assert "--collective_timeout" in e.value.message
    finally:
        for sidecar in group:
            sidecar.stop()


@pytest.mark.parametrize(
    "target",
    [
        "10.1.2.3:50051",
        "example.com:50051",
        "0.0.0.0:50051",
        "[2001:db8::1]:50051",
        "ipv4:127.0.0.1:50051,10.0.0.1:50051",
        "dns:///example.com:50051",
        "127.example.com:1",
    ],
)
def test_a_token_is_never_sent_in_clear_off_loopback(target):
    with pytest.raises(ValueError, match="TLS"):
        SchedulerClient(target, token="s3cret")
    SchedulerClient(target, token="s3cret", tls=True).close()  # over TLS it may go anywhere
    SchedulerClient(target).close()  # no token, no objection


@pytest.mark.parametrize(
    "target",
    [
        "127.0.0.1:50051",
        "127.8.9.10:50051",
        "localhost:50051",
        "LocalHost:1",
        "[::1]:50051",
        "unix:/tmp/packsched.sock",
        "unix-abstract:packsched",
        "ipv4:127.0.0.1:1,127.0.0.2:1",
        "ipv6:[::1]:50051",
        "dns:///localhost:50051",
        "dns:localhost:50051",
    ],
)
def test_a_token_may_go_in_clear_to_loopback(target):
    SchedulerClient(target, token="s3cret").close()


BAD_OPTIONS = [
    ({"order": "Interleave"}, "order 'Interleave'"),
    ({"order": "bubble"}, "order 'bubble'"),
    ({"cap_mode": "wide"}, "cap_mode 'wide'"),
    ({"cost": 2}, "cost 2"),
    ({"overlong": None}, "overlong None"),
    ({"loss_tokens": [1, 1], "loss_mode": "mean"}, "loss_mode 'mean'"),
    ({"loss_tokens": [1, 1], "dp_reduction": "avg"}, "dp_reduction 'avg'"),
    ({"min_micro_batches": 0}, "min_micro_batches = 0"),
    ({"divisible_by": 0}, "divisible_by = 0"),
    ({"align_to": 0}, "align_to = 0"),
    ({"max_micro_batches": 0}, "max_micro_batches = 0"),
    ({"min_micro_batches": 1.5}, "min_micro_batches = 1.5"),
    ({"attention_cost": (1,)}, "attention_cost = (1,)"),
    ({"equal_size": "yes"}, "equal_size = 'yes'"),
]


@pytest.mark.parametrize("options,text", BAD_OPTIONS)
def test_bad_option_values_raise_the_in_process_planners_value_error_before_sending(options, text):
    # The target is unused: a request that went out would end in SchedulerError, not ValueError.
    with pytest.raises(ValueError) as local:
        planner.partition([5, 3], 2, 100, **options)
    assert text in str(local.value)
    with SchedulerClient(unused_target(), timeout=0.5) as c:
        with pytest.raises(ValueError) as remote:
            c.partition([5, 3], 2, 100, **options)
        assert str(remote.value) == str(local.value)
        with pytest.raises(ValueError) as remote:
            c.plan(1, [5, 3], 100, **options)
        assert str(remote.value) == str(local.value)
        with pytest.raises(ValueError) as remote:
            c.balance_batch(
                [5, 3], 2, 100, **{k: v for k, v in options.items() if k != "loss_tokens"}
            )
        assert text in str(remote.value)


def test_the_sidecar_refuses_dataset_packing_algorithms_before_sending():
    assert planner.plan_local([5, 3], 10, algorithm="ffd").num_micro_batches == 1  # in-process
    with SchedulerClient(unused_target(), timeout=0.5) as c:
        with pytest.raises(ValueError, match="algorithm 'ffd' is not one of kk, lpt"):
            c.plan(1, [5, 3], 10, algorithm="ffd")


def test_the_option_vocabulary_is_the_protos_and_the_planners():
    from packsched import _options
    from packsched.v1 import scheduler_pb2

    prefixes = {
        "cap_mode": "CAP_MODE",
        "algorithm": "ALGORITHM",
        "cost": "COST_MODEL",
        "overlong": "OVERLONG_POLICY",
        "order": "PART_ORDER",
        "loss_mode": "LOSS_MODE",
        "dp_reduction": "DP_REDUCTION",
    }
    for name, choices in _options.CHOICES.items():
        proto = {
            v.name
            for v in scheduler_pb2.DESCRIPTOR.enum_types_by_name[
                "".join(w.title() for w in prefixes[name].split("_"))
            ].values
        }
        sidecar = [c for c in choices if name != "algorithm" or c in _options.SIDECAR_ALGORITHMS]
        assert {f"{prefixes[name]}_{c.upper()}" for c in sidecar} | {
            f"{prefixes[name]}_UNSPECIFIED"
        } == proto, name
        for choice in choices:  # the in-process planner accepts every name
            option = {name: choice, "loss_tokens": [1, 1]}
            if choice in ("ffd", "bfd", "sequential"):
                planner.plan_local([5, 3], 10, **option)
            else:
                planner.partition([5, 3], 2, 10, sum_norm_constant=1.0, **option)


def test_partition_needs_global_counts_for_a_world_size_on_both_paths(client):
    lengths, loss_tokens = [100, 200, 300, 400], [50, 0, 100, 150]
    options = dict(loss_tokens=loss_tokens, dp_reduction="mean")
    with pytest.raises(ValueError, match="world_size = 4 needs global_counts") as local:
        planner.partition(lengths, 2, 1000, world_size=4, **options)
    with pytest.raises(ValueError) as remote:
        client.partition(lengths, 2, 1000, world_size=4, **options)
    assert str(remote.value) == str(local.value)
    counts = (600, 6)
    remote = client.partition(lengths, 2, 1000, world_size=4, global_counts=counts, **options)
    local = planner.partition(lengths, 2, 1000, world_size=4, global_counts=counts, **options)
    assert remote.loss_weights == local.loss_weights
    assert remote.loss_weights[0] == pytest.approx(4 / 600)  # W / N_tokens, token_mean
    assert remote.global_counts == local.global_counts == counts


def test_global_counts_without_loss_tokens_give_no_counts_on_both_paths(client):
    remote = client.partition([100, 200], 2, 1000, global_counts=(600, 6))
    local = planner.partition([100, 200], 2, 1000, global_counts=(600, 6))
    assert remote.global_counts is None and local.global_counts is None
    assert remote.loss_weights is None and local.loss_weights is None


def test_status_works_with_protobufs_before_and_after_5_26(client, monkeypatch):
    # protobuf 5.26 renamed MessageToDict's including_default_value_fields to
    # always_print_fields_with_no_presence; trainers' environments may have either.
    from google.protobuf import json_format

    real = json_format.MessageToDict
    if "including_default_value_fields" in inspect.signature(real).parameters:

        def other_api(
            message, always_print_fields_with_no_presence=False, preserving_proto_field_name=False
        ):  # as protobuf >= 5.26
            return real(
                message,
                including_default_value_fields=always_print_fields_with_no_presence,
                preserving_proto_field_name=preserving_proto_field_name,
            )

    else:

        def other_api(
            message, including_default_value_fields=False, preserving_proto_field_name=False
        ):  # as protobuf < 5.26
            return real(
                message,
                always_print_fields_with_no_presence=including_default_value_fields,
                preserving_proto_field_name=preserving_proto_field_name,
            )

    for api in (real, other_api):
        monkeypatch.setattr(json_format, "MessageToDict", api)
        status = client.status()
        assert int(status["rank"]) == 0  # a default value: printed only with every field
        assert int(status["world_size"]) == 1


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
