"""PlanDynamicCp through the sidecars: every rank, asking its own sidecar for its own view of the
same step, gets the same plan (the same fingerprint, group names and slots), the plan of the
in-process planner; each sequence runs exactly once, and reaches its group from its owner."""

import contextlib

import numpy as np
import pytest

from packsched.client import SchedulerClient, SchedulerError
from packsched.dynamic_cp import dynamic_cp
from sidecar import Sidecar, start_group

WORLD = 4


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        sidecars = start_group(tmp_path_factory.mktemp("dcp"), WORLD)
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
