"""The memory budget's guarantee (docs/design.md §3, memory per request; docs/operating.md): under
the default flags, a request on adversarial shapes (tests/python/memory_shapes.py: deep trunks
with a rollout at every node, combs, fan-out at cap 2, long chains, flat amplifiers; Plan,
Partition and BalanceBatch) is either refused with RESOURCE_EXHAUSTED naming its estimate, or
served with the growth of the sidecar's peak resident set within that estimate, and never takes
the sidecar down. Each shape runs on a fresh packsched-server inside a memory cgroup at the deploy
manifest's limit (tests/python/memory_cgroup.py), or, where none can be made, under a watch of
its peak resident set against that limit."""

import re

import grpc
import numpy as np
import pytest

from memory_cgroup import MemoryCgroup
from memory_shapes import shapes
from packsched.v1 import scheduler_pb2_grpc
from sidecar import Sidecar

MANIFEST_LIMIT = 512 << 20  # deploy/: the sidecar container's memory limit
ESTIMATE = re.compile(r"needs an estimated (\d+) bytes")
SHAPES = shapes(np.random.default_rng(7))


def call(sidecar, method, request):
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(sidecar.target, options=options) as channel:
        try:
            getattr(scheduler_pb2_grpc.SchedulerStub(channel), method)(request, timeout=120)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""


@pytest.fixture(scope="module")
def estimate(tmp_path_factory):
    """A sidecar whose budget admits nothing: its refusal names each request's estimate."""
    with Sidecar(tmp_path_factory.mktemp("estimator"), "--max_inflight_bytes=1") as s:

        def of(method, request):
            code, details = call(s, method, request)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            return int(ESTIMATE.search(details)[1])

        yield of


@pytest.mark.parametrize("name, method, request_", SHAPES, ids=[s[0] for s in SHAPES])
def test_refused_or_within_its_estimate(tmp_path, estimate, name, method, request_):
    group = MemoryCgroup.open(MANIFEST_LIMIT)
    try:
        with Sidecar(tmp_path, prefix=group.prefix if group else ()) as s:
            before = s.peak_rss_bytes()
            code, details = call(s, method, request_)
            assert s.poll() is None, f"{name}: the sidecar died ({code.name}: {details})"
            peak = s.peak_rss_bytes()
        assert not (group and group.oom_kills()), f"{name}: OOM kill in the cgroup"
    finally:
        if group:
            group.remove()
    assert peak <= MANIFEST_LIMIT
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        assert ESTIMATE.search(details), details
        return
    assert code == grpc.StatusCode.OK, details
    bound = estimate(method, request_)
    print(f"{name}: peak growth {(peak - before) >> 20} MiB, estimate {bound >> 20} MiB")
    assert peak - before <= bound
