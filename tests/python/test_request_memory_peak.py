"""BalanceBatch's and PlanDynamicCp's memory estimates against the peak a fresh sidecar really
reaches (VmHWM): the estimate covers every per-rank and per-micro-batch structure, and nothing the
default budget admits takes a sidecar past the deploy manifest's 512 MiB. Real packsched-server
processes."""

import re

import grpc
import pytest

from packsched.v1 import scheduler_pb2, scheduler_pb2_grpc
from sidecar import Sidecar

MANIFEST_LIMIT = 512 << 20  # deploy/: the sidecar container's memory limit
DEFAULT_BUDGET = 320 << 20  # --max_inflight_bytes's default
REQUEST_LIMIT = 1 << 20  # --max_sequences_per_request's default
# The most world_size = n admits: one micro-batch per rank, W of them (--max_micro_batches).
LARGEST_WORLD = 1_000_000


def channel_of(sidecar):
    return grpc.insecure_channel(
        sidecar.target,
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    )


def one_per_rank(world_size, sync):
    return scheduler_pb2.BalanceBatchRequest(
        lengths=[1000] * world_size,
        world_size=world_size,
        sync=sync,
        options=scheduler_pb2.PlanOptions(max_token_len=4096),
    )


@pytest.fixture(scope="module")
def estimator(tmp_path_factory):
    """A sidecar whose budget admits nothing: its refusal names each request's estimate."""
    with Sidecar(
        tmp_path_factory.mktemp("estimator"),
        "--max_inflight_bytes=1",
        f"--max_sequences_per_request={REQUEST_LIMIT}",
    ) as s, channel_of(s) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)

        def estimate(request):
            with pytest.raises(grpc.RpcError) as refused:
                stub.BalanceBatch(request, timeout=60)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return int(re.search(r"needs an estimated (\d+) bytes", refused.value.details())[1])

        yield estimate


def peak_of(tmp_path, request, *flags):
    """What `request` adds to a fresh sidecar's peak resident set, and its status code."""
    with Sidecar(tmp_path, *flags) as s, channel_of(s) as channel:
        before = s.peak_rss_bytes()
        code = grpc.StatusCode.OK
        try:
            scheduler_pb2_grpc.SchedulerStub(channel).BalanceBatch(request, timeout=120)
        except grpc.RpcError as e:
            code = e.code()
        return s.peak_rss_bytes() - before, s.peak_rss_bytes(), code


@pytest.mark.parametrize(
    "world_size, sync",
    [
        (400_000, scheduler_pb2.SYNC_STEP),
        (500_000, scheduler_pb2.SYNC_STEP),
        (LARGEST_WORLD, scheduler_pb2.SYNC_STEP),
        (40_000, scheduler_pb2.SYNC_MICRO_BATCH),
    ],
)
def test_estimate_covers_the_measured_peak(tmp_path, estimator, world_size, sync):
    request = one_per_rank(world_size, sync)
    estimate = estimator(request)
    added, _, code = peak_of(
        tmp_path, request, "--max_inflight_bytes=0", f"--max_sequences_per_request={REQUEST_LIMIT}"
    )
    assert code == grpc.StatusCode.OK
    print(f"W = n = {world_size}: estimate {estimate >> 20} MiB, measured {added >> 20} MiB")
    assert estimate >= added


def test_nothing_the_default_budget_admits_passes_the_manifest(tmp_path, estimator):
    # The largest world_size = n the default budget admits (the estimate grows with it).
    low, high = 1, LARGEST_WORLD
    while low < high:
        mid = (low + high + 1) // 2
        if estimator(one_per_rank(mid, scheduler_pb2.SYNC_STEP)) <= DEFAULT_BUDGET:
            low = mid
        else:
            high = mid - 1
    assert low < LARGEST_WORLD
    _, peak, code = peak_of(tmp_path, one_per_rank(low, scheduler_pb2.SYNC_STEP))
    assert code == grpc.StatusCode.OK
    print(f"largest admitted W = n = {low}: sidecar peak {peak >> 20} MiB")
    assert peak <= MANIFEST_LIMIT
    # One more rank is refused under the defaults.
    _, _, refused = peak_of(tmp_path, one_per_rank(low + 1, scheduler_pb2.SYNC_STEP))
    assert refused == grpc.StatusCode.RESOURCE_EXHAUSTED


def dynamic_cp_step(n, world_size, max_cp, seed, rank=None, divisible_by=1):
    """A heavy-tailed step with owners and loss tokens: every part of the response is there."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(np.log(2000), 1.2, n).clip(16, 60000).astype(int).tolist()
    return scheduler_pb2.PlanDynamicCpRequest(
        lengths=lengths,
        world_size=world_size,
        owner_ranks=rng.integers(0, world_size, n).tolist(),
        loss_tokens=[v // 2 for v in lengths],
        options=scheduler_pb2.DynamicCpOptions(
            max_tokens_per_rank=2 * 65536 // max_cp,
            max_cp=max_cp,
            linear=4096,
            quadratic=1,
            divisible_by=divisible_by,
        ),
        rank=rank,
    )


def dynamic_cp_refusal(tmp_path, request, budget):
    """The bytes a sidecar with this budget refuses `request` for (0 if it serves it)."""
    with Sidecar(
        tmp_path, f"--max_inflight_bytes={budget}", f"--max_sequences_per_request={REQUEST_LIMIT}"
    ) as s, channel_of(s) as channel:
        try:
            scheduler_pb2_grpc.SchedulerStub(channel).PlanDynamicCp(request, timeout=120)
            return 0
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
            return int(re.search(r"needs an estimated (\d+) bytes", e.details())[1])


@pytest.mark.parametrize(
    "n, world_size, max_cp, seed, rank, divisible_by",
    # Every view; every view of many ranks; one rank's view of 2^20 ranks in groups of one (the
    # planner's groups of a slot, not the views, are the peak); the adversarial small steps: one
    # sequence, or a few, over 2^20 ranks in groups of one or two with idle slots to a multiple
    # of divisible_by (2^21 and 2^20 idle groups, the planner's limit is 2^21).
    [
        (20000, 64, 64, 5, None, 1),
        (50000, 512, 8, 6, None, 1),
        (3000, 1 << 20, 1, 8, 0, 1),
        (1, 1 << 20, 1, 9, 0, 2),
        (3, 1 << 20, 2, 10, 0, 2),
    ],
)
def test_dynamic_cp_estimate_covers_the_measured_peak(
    tmp_path, n, world_size, max_cp, seed, rank, divisible_by
):
    request = dynamic_cp_step(n, world_size, max_cp, seed, rank, divisible_by)
    # Admission's two steps: the planning (refused under a budget of 1), then the views (refused
    # under a budget that the planning's reservation fills).
    planning = dynamic_cp_refusal(tmp_path, request, 1)
    views = dynamic_cp_refusal(tmp_path, request, planning)
    assert planning > 0 and views > 0
    with Sidecar(
        tmp_path, "--max_inflight_bytes=0", f"--max_sequences_per_request={REQUEST_LIMIT}"
    ) as s, channel_of(s) as channel:
        before = s.peak_rss_bytes()
        scheduler_pb2_grpc.SchedulerStub(channel).PlanDynamicCp(request, timeout=120)
        added = s.peak_rss_bytes() - before
    estimate = planning + views
    print(f"n = {n}, R = {world_size}: estimate {estimate >> 20} MiB, measured {added >> 20} MiB")
    assert estimate >= added


def test_dynamic_cp_tiny_request_for_a_huge_plan_is_refused(tmp_path):
    """One sequence over 2^20 ranks in groups of one, 1000 slots (10^9 groups): the default budget
    refuses it before planning, and without a budget the planner's limit refuses it at once."""
    request = dynamic_cp_step(1, 1 << 20, 1, 11, 0, divisible_by=1000)
    for budget, code, says in [
        (DEFAULT_BUDGET, grpc.StatusCode.RESOURCE_EXHAUSTED, "needs an estimated"),
        (0, grpc.StatusCode.INVALID_ARGUMENT, "divisible_by = 1000"),
    ]:
        with Sidecar(tmp_path, f"--max_inflight_bytes={budget}") as s, channel_of(s) as channel:
            before = s.peak_rss_bytes()
            with pytest.raises(grpc.RpcError) as e:
                scheduler_pb2_grpc.SchedulerStub(channel).PlanDynamicCp(request, timeout=30)
            assert e.value.code() == code, e.value.details()
            assert says in e.value.details()
            assert s.peak_rss_bytes() - before < 16 << 20
