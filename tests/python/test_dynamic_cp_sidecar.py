"""PlanDynamicCp through the sidecars: every rank, asking its own sidecar for its own view of the
same step, gets the same plan (the same fingerprint, group names and slots), the plan of the
in-process planner; each sequence runs exactly once, and reaches its group from its owner. With a
stream, the sidecars agree in one round that every rank sent the same step: a rank that differs
fails it on every rank, and a rank that never comes is bounded by the round's deadline."""

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from packsched.client import SchedulerClient, SchedulerError
from packsched.v1 import scheduler_pb2, scheduler_pb2_grpc
from packsched.dynamic_cp import dynamic_cp
from sidecar import Sidecar, start_group

WORLD = 4
# Short enough that a round missing a rank ends soon; long enough for a loopback formation.
ROUND_TIMEOUT_S = 4


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        sidecars = start_group(
            tmp_path_factory.mktemp("dcp"), WORLD, f"--collective_timeout={ROUND_TIMEOUT_S}s"
        )
        for s in sidecars:
            stack.enter_context(s)
        clients = [stack.enter_context(SchedulerClient(s.target, timeout=20)) for s in sidecars]
        yield clients


def step(seed, n=160):
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(np.log(2500), 1.0, n).clip(16, 30000).astype(int).tolist()
    owners = rng.integers(0, WORLD, n).tolist()
    loss = [int(v) for v in rng.integers(0, 1 + np.array(lengths))]
    return lengths, owners, loss


def test_every_rank_gets_the_same_plan_and_every_sequence_runs_once(group):
    lengths, owners, loss = step(11)
    cap = 9000
    answers = [
        c.plan_dynamic_cp(
            lengths,
            WORLD,
            cap,
            rank=r,
            owner_ranks=owners,
            loss_tokens=loss,
            comm=200,
            quadratic=1,
            linear=2048,
        )
        for r, c in enumerate(group)
    ]
    first = answers[0]
    for a in answers[1:]:
        for key in ("plan_fingerprint", "group_names", "num_micro_batches", "cp_of_sequence"):
            assert a[key] == first[key], key
    mine = {r: a["ranks"] for r, a in enumerate(answers)}
    assert all(len(v) == 1 and v[0]["rank"] == r for r, v in mine.items())

    # The in-process planner's plan, read rank by rank.
    local = dynamic_cp(lengths, WORLD, cap, cost=(2048, 1, 200, 0, 0, 0), loss_tokens=loss)
    assert [list(g) for g in local.group_names] == [
        [int(g["first_rank"]), int(g["size"])] for g in first["group_names"]
    ]
    by_owner = {r: [i for i in range(len(lengths)) if owners[i] == r] for r in range(WORLD)}
    runs = []
    for r in range(WORLD):
        slots = mine[r][0]["slots"]
        assert len(slots) == first["num_micro_batches"]
        for s, (view, ref) in enumerate(zip(slots, local.for_rank(r))):
            seqs = [int(v) for v in view["sequences"]]
            c = int(view["ranks"]["size"])
            assert seqs == list(ref.sequences)
            assert int(view["group"]) == ref.group_name
            assert int(view["cp_rank"]) == ref.cp_rank
            assert [int(v) for v in view["cu_seqlens"]] == list(ref.cu_seqlens)
            assert view["loss_weights"] == pytest.approx(list(ref.loss_weights))
            assert [int(v) for v in view["shard_chunks"]] == [ref.cp_rank, 2 * c - 1 - ref.cp_rank]
            # Each sequence named by its owner and its index among the owner's sequences.
            for seq, owner, index in zip(seqs, view["owner_ranks"], view["owner_indices"]):
                assert by_owner[int(owner)][int(index)] == seq
            if ref.cp_rank == 0:
                runs += seqs
    assert sorted(runs) == list(range(len(lengths)))


def test_every_view_from_one_sidecar_matches_the_per_rank_views(group):
    lengths, owners, _ = step(23, n=90)
    whole = group[0].plan_dynamic_cp(lengths, WORLD, 12000, sizes="divisors", tensor_parallel=2)
    assert [int(v["rank"]) for v in whole["ranks"]] == list(range(WORLD))
    one = group[3].plan_dynamic_cp(
        lengths, WORLD, 12000, sizes="divisors", tensor_parallel=2, rank=2
    )
    assert one["plan_fingerprint"] == whole["plan_fingerprint"]
    assert one["ranks"][0] == whole["ranks"][2]
    assert int(whole["options"]["tensor_parallel"]) == 2
    assert whole["options"]["sizes"] == "divisors"
    other = group[0].plan_dynamic_cp(lengths, WORLD, 8000, sizes="divisors", tensor_parallel=2)
    assert other["ranks"] != whole["ranks"]
    assert other["plan_fingerprint"] != whole["plan_fingerprint"]


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"max_cp": 3}, "max_cp = 3: must divide ranks = 4"),
        ({"min_cp": -1}, "options.min_cp = -1"),
        ({"sizes": "any", "max_cp": 2, "max_tokens": 200}, "sequence 1 (length 900)"),
        ({"rank": 4}, "rank = 4"),
        ({"owner_ranks": [0, 5]}, "owner_ranks[1] = 5"),
        ({"loss_tokens": [1, 901]}, "loss_tokens[1] = 901"),
        ({"linear": -2}, "options.linear = -2"),
        ({"micro_batch_cost": -3}, "options.micro_batch_cost = -3"),
    ],
)
def test_bad_requests_are_invalid_argument_naming_the_field(group, kwargs, text):
    kwargs = dict(kwargs)
    cap = kwargs.pop("max_tokens", 1000)
    with pytest.raises(SchedulerError) as e:
        group[1].plan_dynamic_cp([300, 900], WORLD, cap, **kwargs)
    assert e.value.code == "INVALID_ARGUMENT"
    assert text in str(e.value)


def test_requests_over_the_limits_are_refused(tmp_path):
    flags = ("--max_sequences_per_request=3000", "--max_inflight_bytes=8000000")
    with Sidecar(tmp_path, *flags) as s, SchedulerClient(s.target, timeout=20) as c:
        with pytest.raises(SchedulerError) as e:
            c.plan_dynamic_cp([100] * 3001, 8, 1000, rank=0)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert "--max_sequences_per_request = 3000" in str(e.value)
        # Trailing idle slots of 2^20 groups of one each: refused before planning.
        with pytest.raises(SchedulerError) as e:
            c.plan_dynamic_cp([100] * 10, 1 << 20, 1000, max_cp=1, divisible_by=64)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert "this PlanDynamicCp request" in str(e.value)
        with pytest.raises(SchedulerError) as e:
            c.plan_dynamic_cp([100] * 10, 8, 1000, divisible_by=10**9)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert "divisible_by = 1000000000 slots exceed the server limit --max_micro_batches" in str(
            e.value
        )
        # Sequences that each need all 1,024 ranks: 2,000 slots, and every rank's view of each.
        # Planning is admitted (its estimate fits); the views are refused once their size is known.
        lengths = [100_000] * 2000
        with pytest.raises(SchedulerError) as e:
            c.plan_dynamic_cp(lengths, 1024, 100)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert "PlanDynamicCp response's views" in str(e.value)
        # One rank's view of the same step fits.
        answer = c.plan_dynamic_cp(lengths, 1024, 100, rank=5)
        assert answer["num_micro_batches"] == 2000
        assert [v["rank"] for v in answer["ranks"]] == [5]
        assert c.status()["counters"]["dynamic_cp_plans"] == "1"  # MessageToDict: int64 as text


def on_every_rank(group, call, ranks=None):
    """call(rank, client) on the given ranks at once (a round needs every rank): per rank its
    answer, or the SchedulerError it raised."""
    ranks = list(range(WORLD)) if ranks is None else ranks

    def one(r):
        try:
            return call(r, group[r])
        except SchedulerError as e:
            return e

    with ThreadPoolExecutor(len(ranks)) as pool:
        return dict(zip(ranks, pool.map(one, ranks)))


def test_with_a_stream_every_rank_agrees_the_step_and_gets_the_same_plan(group):
    lengths, owners, loss = step(31, n=120)
    kwargs = dict(owner_ranks=owners, loss_tokens=loss, comm=100, quadratic=1)
    alone = group[0].plan_dynamic_cp(lengths, WORLD, 10000, **kwargs)
    for round_ in (7, 8):
        answers = on_every_rank(
            group,
            lambda r, c: c.plan_dynamic_cp(
                lengths, WORLD, 10000, rank=r, stream="dcp-agree", round=round_, **kwargs
            ),
        )
        for r, a in answers.items():
            assert not isinstance(a, Exception), a
            assert a["plan_fingerprint"] == alone["plan_fingerprint"]
            assert a["ranks"] == [alone["ranks"][r]]
    # One agreement round per call on each sidecar, on the named stream.
    for c in group:
        (stream,) = [s for s in c.status()["streams"] if s["name"] == "dcp-agree"]
        assert int(stream["rounds_completed"]) == 2
        assert int(stream["last_round"]) == 8


@pytest.mark.parametrize(
    "change, stream",
    [
        (lambda request: request["lengths"].__setitem__(5, request["lengths"][5] + 1), "dcp-len"),
        (lambda request: request.__setitem__("comm", 300), "dcp-opt"),
    ],
    ids=["one length", "one option"],
)
def test_a_rank_with_a_different_step_fails_the_round_on_every_rank(group, change, stream):
    lengths, owners, _ = step(37, n=80)
    odd = 2

    def request(r):
        request = dict(lengths=list(lengths), owner_ranks=owners, comm=100)
        if r == odd:
            change(request)
        return request

    def send(r, c, round_):
        kwargs = request(r)
        return c.plan_dynamic_cp(
            kwargs.pop("lengths"), WORLD, 9000, rank=r, stream=stream, round=round_, **kwargs
        )

    start = time.monotonic()
    answers = on_every_rank(group, lambda r, c: send(r, c, 1))
    # A mismatch is found in the round itself, not by waiting for its deadline.
    assert time.monotonic() - start < ROUND_TIMEOUT_S
    for r, e in answers.items():
        assert isinstance(e, SchedulerError), (r, e)
        assert e.code == "FAILED_PRECONDITION"
        assert "the ranks sent different steps" in str(e)
        assert f"rank {odd} has fingerprint" in str(e)
    # Nothing is left behind: the next round, with the same step everywhere, agrees.
    answers = on_every_rank(
        group,
        lambda r, c: c.plan_dynamic_cp(
            lengths, WORLD, 9000, rank=r, owner_ranks=owners, comm=100, stream=stream, round=2
        ),
    )
    assert len({a["plan_fingerprint"] for a in answers.values()}) == 1


def test_a_rank_that_never_comes_is_bounded_by_the_rounds_deadline(group):
    lengths, _, _ = step(41, n=40)

    def send(r, c, round_):
        return c.plan_dynamic_cp(lengths, WORLD, 9000, rank=r, stream="dcp-missing", round=round_)

    first = on_every_rank(group, lambda r, c: send(r, c, 1))  # the stream's group forms
    assert all(not isinstance(a, Exception) for a in first.values()), first
    # Rank 3 never sends round 2: its peers' round ends at the deadline, naming it.
    start = time.monotonic()
    answers = on_every_rank(group, lambda r, c: send(r, c, 2), ranks=[0, 1, 2])
    assert time.monotonic() - start < 3 * ROUND_TIMEOUT_S
    for r, e in answers.items():
        assert isinstance(e, SchedulerError), (r, e)
        assert e.code == "DEADLINE_EXCEEDED"
        assert "[3]" in str(e), str(e)
    # Then every rank agrees round 3 (the group forms again).
    answers = on_every_rank(group, lambda r, c: send(r, c, 3))
    for a in answers.values():
        assert not isinstance(a, Exception), a
    assert {a["plan_fingerprint"] for a in answers.values()} == {first[0]["plan_fingerprint"]}


def test_sigterm_ends_a_step_round_waiting_for_a_peer(tmp_path):
    # A long round deadline: SIGTERM, not the deadline, must end the round rank 0 waits in.
    sidecars = start_group(tmp_path, 2, "--collective_timeout=60s")
    with contextlib.ExitStack() as stack:
        for s in sidecars:
            stack.enter_context(s)
        clients = [stack.enter_context(SchedulerClient(s.target, timeout=20)) for s in sidecars]
        lengths = [300, 900, 5000]
        first = on_every_rank(
            clients,
            lambda r, c: c.plan_dynamic_cp(lengths, 2, 4000, rank=r, stream="dcp", round=1),
            ranks=[0, 1],
        )
        assert all(not isinstance(a, Exception) for a in first.values()), first
        request = scheduler_pb2.PlanDynamicCpRequest(
            lengths=lengths, world_size=2, stream="dcp", round=2
        )
        request.options.max_tokens_per_rank = 4000
        with grpc.insecure_channel(sidecars[0].target) as channel:
            call = scheduler_pb2_grpc.SchedulerStub(channel).PlanDynamicCp.future(
                request, timeout=60
            )
            time.sleep(0.5)  # in its round, waiting for rank 1
            assert not call.done()
            start = time.monotonic()
            assert sidecars[0].terminate(timeout=10) == 0
            with pytest.raises(grpc.RpcError) as stopped:
                call.result(timeout=10)
            # The round's own answer at shutdown (Plan's): Aborted, naming the round.
            assert stopped.value.code() == grpc.StatusCode.ABORTED
            assert "round 2" in stopped.value.details()
            assert time.monotonic() - start < 10


def test_a_round_without_a_stream_is_invalid(group):
    with pytest.raises(SchedulerError) as e:
        group[0].plan_dynamic_cp([300, 900], WORLD, 1000, round=3)
    assert e.value.code == "INVALID_ARGUMENT"
    assert "round = 3 without a stream" in str(e.value)
    with pytest.raises(SchedulerError) as e:
        group[0].plan_dynamic_cp([300, 900], WORLD, 1000, stream="bad\nname")
    assert e.value.code == "INVALID_ARGUMENT"
    assert "stream has byte 10" in str(e.value)
