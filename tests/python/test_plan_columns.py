"""Plans read from the planner's numpy columns (packsched.planner's path) against the same plans
built from the binding's dicts and lists (Plan.from_raw), field by field: the lazy lists hold the
same values, of the same documented types, however and in whatever order they are read."""

import pickle

import numpy as np
import pytest

from packsched import _planner, planner
from packsched._options import split_options
from packsched.plan import MicroBatchMeta, Plan
from packsched.planner import Lazy

FIELDS = (
    "num_micro_batches",
    "local_num_micro_batches",
    "micro_batches",
    "metadata",
    "reorder",
    "revert",
    "dropped",
    "loss_weights",
    "loss_scales",
    "empty",
    "stats",
    "global_counts",
)


def lengths_of(n, seed, longest=4500):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(900), 1.2, n), 1, longest).astype(np.int64)


def same(plan, want):
    for name in FIELDS:
        # A micro-batch whose loss weights differ has loss_scale NaN: compared by repr.
        got, expected = getattr(plan, name), getattr(want, name)
        nan = name in ("metadata", "loss_scales")
        assert (repr(got) == repr(expected)) if nan else got == expected, name
    assert all(type(a) is type(b) for a, b in zip(plan.micro_batches, want.micro_batches))
    assert all(isinstance(m, MicroBatchMeta) for m in plan.metadata)
    assert type(plan.reorder) is list and type(plan.revert) is list
    if plan.loss_scales is None:
        assert plan == want


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"align_to": 8, "align_total_to": 64, "cost": "attention"},
        {"overlong": "drop"},
        {"overlong": "isolate", "order": "index"},
        {"loss_tokens": "half", "loss_mode": "sample_mean"},
    ],
)
@pytest.mark.parametrize("k", [0, 1200])
def test_plan_and_partition_columns_equal_the_dicts(options, k):
    # Longer than the cap (5,000) only where the options drop or isolate them.
    lengths = lengths_of(3000, 11 + k, 9000 if "overlong" in options else 4500)
    options = dict(options)
    if options.get("loss_tokens") == "half":
        options["loss_tokens"] = (lengths // 2).tolist()
    plan_options, loss = split_options(5000, dict(options), where="partition")
    weights = None
    if loss["loss_tokens"] is not None:
        weights = dict(loss, global_counts=None, world_size=1)
    want = Plan.from_raw(_planner.plan(lengths, plan_options, k, weights), cap=5000)
    got = (
        planner.partition(lengths, k, 5000, **options)
        if k
        else planner.plan_local(lengths, 5000, **options)
    )
    same(got, want)


def test_lazy_lists_read_in_any_order_and_pickle():
    lengths = lengths_of(2000, 5)
    want = planner.partition(lengths, 600, 6000)
    for order in (("revert", "metadata"), ("metadata", "micro_batches"), ("empty", "reorder")):
        got = planner.partition(lengths, 600, 6000)
        for name in order:
            assert getattr(got, name) == getattr(want, name)
        same(got, want)
    fresh = planner.partition(lengths, 600, 6000)
    assert pickle.loads(pickle.dumps(fresh)) == want
    with pytest.raises(AttributeError, match="no_such_field"):
        fresh.no_such_field  # noqa: B018


@pytest.mark.parametrize("sync", ["step", "micro_batch"])
def test_balance_columns_equal_the_dicts(sync):
    lengths = lengths_of(5000, 21, 12000)
    plan_options, _ = split_options(9000, {"overlong": "drop"}, where="balance", cap_required=True)
    raw = _planner.balance(lengths, 16, plan_options, [], sync, 1000, None, {})
    got = planner.balance(lengths, 16, 9000, sync=sync, micro_batch_cost=1000, overlong="drop")
    assert isinstance(got.ranks, Lazy) and len(got.ranks) == 16
    assert got.dropped == raw["dropped"] and got.num_micro_batches == raw["num_micro_batches"]
    # Ranks read from the end first, then all, then by slices.
    assert got.ranks[-1].indices == raw["ranks"][-1]["indices"]
    for rank, want in zip(got.ranks, raw["ranks"]):
        assert rank.indices == want["indices"] and rank.cost == want["cost"]
        same(rank.plan, Plan.from_raw(want["plan"], cap=9000))
    assert got.ranks[2:4] == [got.ranks[2], got.ranks[3]]
    again = planner.balance(lengths, 16, 9000, sync=sync, micro_batch_cost=1000, overlong="drop")
    assert again == got and again.ranks == list(got.ranks)
    with pytest.raises(IndexError):
        got.ranks[16]  # noqa: B018
