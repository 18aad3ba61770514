"""The packsched planner in-process (pybind11, no sidecar needed).

For trainers that already have a process group: each rank calls ``local_bound``, the trainer
all-reduces the bounds (MAX) and the loss counts (SUM) itself, then each rank calls ``partition``
with the agreed k. ``plan_local`` is the one-rank shortcut, ``balance`` the coordinator mode (the
whole global batch over W data-parallel ranks in one call).

A call that runs longer than a few seconds (10^7 sequences) reports on stderr while it plans, as
``packsched plan`` does: ``progress=False`` silences it, a callable gets the lines instead
(packsched._progress). Only a call on at least ``packsched._progress.MIN_SIZE`` (2^16) sequences,
or forest nodes, is watched (by a thread of its own); a smaller one, which plans in well under a
second, starts nothing and reports nothing, whatever ``progress`` says.

Every function takes the keyword options of ``SchedulerClient.plan`` with the same defaults
(see packsched._options), and gives the plan the sidecar and ``packsched plan`` give for the same
input. ``seq_lens``: per-sequence token counts, a list, numpy array or torch tensor of integers,
or a ``packsched.tree.Forest`` of rollouts: then the plan is a ``packsched.tree.TreePlan`` (tree
packing: each shared token forwarded once; loss_tokens and the loss weights are per rollout).
The arrays are checked by packsched._inputs and the option values by packsched._options, with the
messages ``SchedulerClient`` gives (TypeError for data that is not integers, ValueError for a bad
shape, an empty ``seq_lens`` or a bad option value); values the planner refuses raise ValueError
with the planner's message. An empty ``seq_lens`` is nothing to plan for ``plan_local`` and
``balance`` (as for the sidecar and ``packsched plan``); ``local_bound`` and ``partition`` take it:
a data-parallel rank with no sequences joins the agreed count and gets k empty micro-batches.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import _planner
from ._inputs import int_array
from ._options import CAP, SCHEMA, check_world_size, split_options
from ._progress import Progress
from .model_cost import model_fields
from .plan import Plan, lists_of
from .tree import Forest, TreePlan

__all__ = [
    "plan_local",
    "local_bound",
    "partition",
    "balance",
    "Bound",
    "RankPlan",
    "Balanced",
    "StepStats",
    "Lazy",
    "SYNCS",
]

SYNCS = ("step", "micro_batch")


@dataclass(frozen=True)
class Bound:
    """One rank's bound before agreement. ``k``: the smallest micro-batch count the planner found
    for this rank alone (k_r); ``lower_bound_k``: the count no plan can go below;
    ``loss_counts``: (loss tokens, sequences with loss) over the kept sequences, when loss_tokens
    were given — the values to all-reduce (SUM) for the loss weights."""

    k: int
    lower_bound_k: int
    num_sequences: int
    num_kept: int
    total_tokens: int
    dropped: list
    loss_counts: tuple = None


@dataclass(frozen=True)
class RankPlan:
    """One DP rank's share of a balanced global batch: its global ``indices`` (ascending), their
    total ``cost``, and its micro-batch ``plan`` (whose indices are positions in ``indices``)."""

    indices: list
    cost: int
    plan: Plan


@dataclass(frozen=True)
class StepStats:
    """The step of a balanced batch (docs/design.md §2): a micro-batch costs ``micro_batch_cost``
    plus its sequences' costs (0 when empty); ``step_sync_cost`` = max over ranks of their sums,
    ``micro_batch_sync_cost`` = sum over slots of the max over ranks; ``ideal`` = (total cost +
    micro_batch_cost x k_min x W) / W; ``efficiency`` = ideal / the cost under the call's sync;
    ``lower_bound``: no plan's step is shorter; ``lower_bound_efficiency`` = ideal / lower_bound."""

    step_sync_cost: int
    micro_batch_sync_cost: int
    ideal: float
    efficiency: float
    lower_bound: int
    lower_bound_efficiency: float


class Lazy(Sequence):
    """A read-only list whose items are made on first access (``make(i)``) and kept: a balanced
    batch of 10^5 ranks returns without building a RankPlan, and each rank costs what reading it
    costs. Compares equal to a list or tuple of the same items."""

    def __init__(self, size, make):
        self._items = [None] * size
        self._make = make

    def __len__(self):
        return len(self._items)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._items)))]
        item = self._items[i]  # IndexError past the end, as a list
        if item is None:
            item = self._items[i] = self._make(i % len(self._items))
        return item

    def __eq__(self, other):
        if isinstance(other, (Lazy, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return repr(list(self))


@dataclass(frozen=True)
class Balanced:
    ranks: Sequence  # RankPlan per DP rank (a Lazy list: each made when first read)
    num_micro_batches: int  # the common k
    dropped: list  # global indices dropped (overlong="drop")
    step: StepStats = None


def _progress(where, lengths, report):
    return Progress(f"{where}: {len(lengths)} sequences", report, size=len(lengths))


def _forest_progress(where, forest, report):
    return Progress(
        f"{where}: a forest of {forest.num_rollouts} rollouts",
        report,
        size=forest.num_nodes,
    )


def _forest_arrays(forest):
    """The binding's forest arguments (the schema's forest table, in order): the Checked rollout
    lengths as None, the forest derived them from its paths."""
    return tuple(
        None if f["kind"] == "Checked" else getattr(forest, f["name"]) for f in SCHEMA["forest"]
    )


def _loss(loss, n, global_counts, world_size):
    if loss["loss_tokens"] is None:
        return None
    tokens = int_array(loss["loss_tokens"], "loss_tokens", allow_empty=True)
    if len(tokens) != n:
        raise ValueError(f"loss_tokens has {len(tokens)} entries for {n} sequences")
    return dict(
        loss, loss_tokens=tokens.tolist(), global_counts=global_counts, world_size=world_size
    )


def plan_local(seq_lens, max_token_len, *, progress=True, **options):
    """Plans one rank's micro-batches on its own: the smallest micro-batch count that keeps every
    micro-batch within ``max_token_len`` (kk/lpt), or dataset packing (ffd/bfd/sequential).
    Loss weights (with ``loss_tokens``) use this rank's own counts, world size 1. -> Plan"""
    forest = seq_lens if isinstance(seq_lens, Forest) else None
    lengths = None if forest is not None else int_array(seq_lens, "seq_lens")
    plan_options, loss = split_options(
        max_token_len, options, where="plan_local", cap_required=True
    )
    if forest is not None:
        weights = _loss(loss, forest.num_rollouts, None, 1)
        with _forest_progress("plan_local", forest, progress):
            raw = _planner.forest_plan(*_forest_arrays(forest), plan_options, 0, weights)
        return TreePlan.from_raw(raw, forest=forest, cap=max_token_len)
    with _progress("plan_local", lengths, progress):
        raw = _planner.plan_columns(lengths, plan_options, 0, _loss(loss, len(lengths), None, 1))
    return Plan.from_columns(raw, cap=max_token_len)


def local_bound(seq_lens, max_token_len, *, progress=True, **options):
    """This rank's bound k_r (and its loss counts, with ``loss_tokens``) before agreement.
    -> Bound"""
    forest = seq_lens if isinstance(seq_lens, Forest) else None
    lengths = None if forest is not None else int_array(seq_lens, "seq_lens", allow_empty=True)
    plan_options, loss = split_options(
        max_token_len, options, where="local_bound", cap_required=True
    )
    tokens = None
    if loss["loss_tokens"] is not None:
        tokens = int_array(loss["loss_tokens"], "loss_tokens", allow_empty=True).tolist()
    if forest is not None:
        with _forest_progress("local_bound", forest, progress):
            raw = _planner.forest_local_bound(*_forest_arrays(forest), plan_options, tokens)
    else:
        with _progress("local_bound", lengths, progress):
            raw = _planner.local_bound(lengths, plan_options, tokens)
    return Bound(**{**raw, "loss_counts": raw.get("loss_counts")})


def partition(
    seq_lens, k, max_token_len=None, *, global_counts=None, world_size=1, progress=True, **options
):
    """Splits into exactly ``k`` micro-batches (an agreed k >= every rank's bound: cannot fail for
    valid input). ``global_counts``: the round's summed (loss tokens, sequences with loss) for the
    loss weights (default: this rank's own, world size 1); ``world_size``: the DP ranks those
    counts were summed over (for dp_reduction="mean"). ``world_size`` != 1 without
    ``global_counts`` raises ValueError, as ``SchedulerClient.partition`` does: weights for W ranks
    need the counts of all W. ``Plan.global_counts`` is set only with ``loss_tokens`` (no weights,
    no counts). -> Plan"""
    forest = seq_lens if isinstance(seq_lens, Forest) else None
    lengths = None if forest is not None else int_array(seq_lens, "seq_lens", allow_empty=True)
    plan_options, loss = split_options(max_token_len, options, where="partition")
    check_world_size("partition", global_counts, world_size)
    if k < 1:
        raise ValueError(f"k = {k}: must be >= 1")
    counts = None
    if global_counts is not None and loss["loss_tokens"] is not None:
        counts = tuple(global_counts)
    if forest is not None:
        weights = _loss(loss, forest.num_rollouts, global_counts, world_size)
        with _forest_progress("partition", forest, progress):
            raw = _planner.forest_plan(*_forest_arrays(forest), plan_options, int(k), weights)
        return TreePlan.from_raw(raw, forest=forest, cap=max_token_len, global_counts=counts)
    with _progress("partition", lengths, progress):
        raw = _planner.plan_columns(
            lengths, plan_options, int(k), _loss(loss, len(lengths), global_counts, world_size)
        )
    return Plan.from_columns(raw, cap=max_token_len, global_counts=counts)


def balance(
    seq_lens,
    world_size,
    max_token_len,
    *,
    group_ids=None,
    sync="step",
    micro_batch_cost=0,
    model_config=None,
    progress=True,
    **options,
):
    """Coordinator mode: balances the whole global batch over ``world_size`` DP ranks (members of
    a ``group_ids`` group stay on one rank), then plans each rank's micro-batches with one common
    k: ``ranks[r].plan.micro_batches[i]`` is rank r's micro-batch in slot i.
    ``sync="step"``: balanced rank totals (ranks meet once per step), equal counts unless free
    counts shorten the step by more than 1/1024 (docs/design.md, "Coordinator mode's sync"),
    k at most the k bound (ceil(FFD bins of the batch / world_size), rounded up to
    ``divisible_by``, at least ``min_micro_batches``), or one step of ``divisible_by`` more when
    that shortens the step by more than 1/1024 (``micro_batch_cost`` counted);
    ``sync="micro_batch"``: every slot balanced over the ranks (ranks meet at every micro-batch:
    FSDP/ZeRO-3, pipeline or context parallelism), counts may differ. ``micro_batch_cost``: a
    fixed cost per non-empty micro-batch. ``model_config``: a Hugging Face style config (a dict
    or the path of a config.json): the cost becomes the model's FLOPs (attention weights and
    ``micro_batch_cost``, see ``packsched.model_cost``), whatever the cost options say.
    A Forest instead of ``seq_lens``: its pieces balanced (``model_config`` costs the model over
    the forest, see ``packsched.model_cost``); each rank's plan is a TreePlan with global rollout
    ids. With fewer pieces than ranks, pieces are split at rollout boundaries first, and a split
    tree's pieces spread over ranks when that balances better: every rank holds a rollout
    whenever the forest has at least ``world_size`` (docs/design.md, "Tree packing").
    ``group_ids`` with a forest are one per rollout: each tree is cut at its rollouts' groups
    (a prefix shared by several groups is forwarded once per group) and a group's rollouts stay
    on one rank; every rank holds a rollout whenever there are at least ``world_size`` groups;
    a group needing more micro-batches on its rank than ``max_micro_batches`` allows is a
    ValueError naming it. A forest with no rollouts is a ValueError (nothing to plan).
    -> Balanced"""
    if sync not in SYNCS:
        raise ValueError(f"sync = {sync!r}: must be one of {', '.join(SYNCS)}")
    forest = seq_lens if isinstance(seq_lens, Forest) else None
    lengths = None if forest is not None else int_array(seq_lens, "seq_lens")
    ints, strings = (None, {}) if model_config is None else model_fields(model_config)
    plan_options, loss = split_options(max_token_len, options, where="balance", cap_required=True)
    if loss["loss_tokens"] is not None:
        raise ValueError("balance: loss weights are computed per rank (plan each rank's share)")
    groups = (
        [] if group_ids is None else int_array(group_ids, "group_ids", allow_empty=True).tolist()
    )
    if forest is not None:
        with _forest_progress("balance", forest, progress):
            return _balance_forest(
                forest, world_size, plan_options, sync, micro_batch_cost, ints, strings, groups
            )
    with _progress("balance", lengths, progress):
        raw = _planner.balance_columns(
            lengths,
            int(world_size),
            plan_options,
            groups,
            sync,
            int(micro_batch_cost),
            ints,
            strings,
        )

    def rank(r):
        lists = lists_of(raw)
        offsets = lists["rank_indices_offsets"]
        indices = lists["rank_indices"][offsets[r] : offsets[r + 1]]
        return RankPlan(
            indices, lists["rank_cost"][r], Plan.from_columns(raw, r, cap=max_token_len)
        )

    ranks = Lazy(len(raw["rank_cost"]), rank)
    return Balanced(ranks, raw["num_micro_batches"], raw["batch_dropped"], StepStats(**raw["step"]))


def _balance_forest(
    forest, world_size, plan_options, sync, micro_batch_cost, ints, strings, groups
):
    raw = _planner.forest_balance(
        *_forest_arrays(forest),
        int(world_size),
        plan_options,
        sync,
        int(micro_batch_cost),
        ints,
        strings,
        groups,
    )
    ranks = []
    for r in raw["ranks"]:
        plan = TreePlan.from_raw(r, forest=forest, cap=plan_options[CAP])
        indices = np.flatnonzero(plan.rollout_part >= 0).tolist()
        ranks.append(RankPlan(indices, r["cost"], plan))
    return Balanced(ranks, raw["num_micro_batches"], raw["dropped"], StepStats(**raw["step"]))
