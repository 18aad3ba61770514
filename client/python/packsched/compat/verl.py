"""Drop-ins for verl's dynamic batching: the whole ``verl.utils.seqlen_balancing`` module.

    import sys, packsched.compat.verl
    sys.modules["verl.utils.seqlen_balancing"] = packsched.compat.verl   # before verl imports it

``rearrange_micro_batches``, ``prepare_dynamic_batch``, ``get_reverse_idx``,
``restore_dynamic_batch``, ``get_seqlen_balanced_partitions``, ``karmarkar_karp``,
``greedy_partition``, ``get_group_balanced_partitions``, ``log_seqlen_unbalance``,
``calculate_workload``, ``ceildiv`` and ``roundup_divisible``, with verl's signatures, defaults
and return values (``force_group_size`` included). What changes:
verl starts from k = ceil(total / max_token_len), which is often infeasible (earlier verl
releases kept it, leaving micro-batches over the cap; verl 0.9.1 retries its Karmarkar–Karp
partition with k + 1, k + 2, ... until the cap holds, one all-reduce per try); packsched picks
the smallest k it can prove feasible in one step (the max over the DP group, like verl) and never
exceeds the cap unless one sequence alone does (that sequence then runs alone). So verl's own
tests pass except where they assert verl's count and that count breaks the cap
(tests/python/test_compat_verl_suite.py), and verl 0.9.1's engine gives the same log-probs with
either module (tests/python/test_verl_real.py). Balancing
uses packsched's attention-aware cost (24576·L + L², verl's workload estimate) unless
``cost="tokens"`` is passed. The partition helpers balance any non-negative integers (sequence
lengths, or workloads beyond 2^31) with packsched's Karmarkar–Karp / LPT; verl's assertions
become ValueError. Nested (jagged) ``input_ids`` give the lengths where torch has the jagged
layout (torch >= 2.2), as verl reads them, and every jagged entry of the batch (a dict, a
TensorDict or a DataProto's) is split into micro-batches that keep its layout and ragged
dimension, as verl's ``index_select_tensor_dict`` does; an older torch refuses them with a
ValueError that says so.

Through a sidecar (``use_sidecar``), call ``set_global_step(data.meta_info["global_steps"])`` at
the start of each step in the worker: rounds are then numbered from the trainer's step, and a
trainer resumed from a checkpoint replays them under the same numbers (docs/operating.md,
Restarts).
"""

import copy

from .. import planner
from ._dist import agree_max
from ._balancing import (
    calculate_workload,
    ceildiv,
    get_group_balanced_partitions,
    get_seqlen_balanced_partitions,
    greedy_partition,
    karmarkar_karp,
    log_seqlen_unbalance,
    roundup_divisible,
)
from ._indices import get_reverse_idx
from ._rows import jagged, take_rows
from ._verl_tree import TreePacking, tree_log_probs, tree_pack_batch, tree_unpack

__all__ = [
    "rearrange_micro_batches",
    "prepare_dynamic_batch",
    "get_reverse_idx",
    "restore_dynamic_batch",
    "use_sidecar",
    "set_global_step",
    "get_seqlen_balanced_partitions",
    "karmarkar_karp",
    "greedy_partition",
    "get_group_balanced_partitions",
    "log_seqlen_unbalance",
    "calculate_workload",
    "ceildiv",
    "roundup_divisible",
    "TreePacking",
    "tree_pack_batch",
    "tree_unpack",
    "tree_log_probs",
]

_sidecar = None  # _Sidecar once use_sidecar() was called

CALLS_PER_STEP = 1000  # round numbers per training step (set_global_step), unless use_sidecar says


class _Sidecar:
    def __init__(self, client, stream, first_round, calls_per_step):
        self.client = client
        self.stream = stream
        self.next_round = first_round
        self.calls_per_step = calls_per_step
        self.step_end = None  # the first round of the next step, once set_global_step() was called

    def take_round(self):
        """The round of this call: the next number, whatever happens to the call."""
        round_ = self.next_round
        if self.step_end is not None and round_ >= self.step_end:
            raise ValueError(
                f"more than calls_per_step = {self.calls_per_step} rearrange_micro_batches calls "
                "since set_global_step(): the next call would take a round of the next step; "
                "pass a larger calls_per_step to use_sidecar() on every rank"
            )
        self.next_round += 1
        return round_


def use_sidecar(client, stream="verl", first_round=0, *, calls_per_step=CALLS_PER_STEP):
    """Plans through this rank's packsched sidecar instead of the in-process planner plus a
    torch.distributed all-reduce: the sidecars agree the count (``dp_group`` is then ignored).
    Every rank must make the same sequence of rearrange_micro_batches calls: the n-th call of each
    rank is round first_round + n of ``stream``, whatever happened to the earlier calls (a failed
    round is not retried under its number: its peers may have finished it), until
    ``set_global_step`` numbers the calls from the trainer's step instead (at most
    ``calls_per_step`` calls per step). ``client=None`` switches back.

    A trainer resumed from a checkpoint against sidecars that served its earlier steps gets the
    same plans for the steps it replays when its data is the same (while those rounds are cached:
    --max_cached_rounds per stream); with other data it must start a new epoch of the stream: a
    new ``stream`` name on every rank, e.g. ``f"verl@{restart_count}"`` (docs/operating.md,
    Restarts)."""
    global _sidecar
    if client is None:
        _sidecar = None
        return
    if int(calls_per_step) < 1:
        raise ValueError(f"calls_per_step is {calls_per_step}: at least 1")
    _sidecar = _Sidecar(client, stream, int(first_round), int(calls_per_step))


def set_global_step(step):
    """Numbers the following rearrange_micro_batches calls from the trainer's global step: the
    n-th call after this one is round ``step * calls_per_step + n`` of the stream. Call it on every
    rank at the start of each training step with the trainer's step (verl's worker:
    ``data.meta_info["global_steps"]``), so that a trainer resumed from a checkpoint replays its
    steps under the rounds they had, and every process numbers them alike however long it has
    run. Does nothing without a sidecar (in-process planning has no rounds)."""
    if _sidecar is None:
        return
    step = int(step)
    if step < 0:
        raise ValueError(f"step is {step}: at least 0")
    _sidecar.next_round = step * _sidecar.calls_per_step
    _sidecar.step_end = _sidecar.next_round + _sidecar.calls_per_step


def rearrange_micro_batches(
    batch,
    max_token_len,
    dp_group=None,
    num_batches_divided_by=None,
    same_micro_num_in_dp=True,
    min_num_micro_batch=None,
    use_dynamic_bsz_balance=True,
    force_group_size=1,
    *,
    cost="attention",
):
    """Splits ``batch`` into micro-batches of at most ``max_token_len`` real tokens each.

    batch: a TensorDict or a mapping of tensors indexed on dim 0, with "attention_mask"
        [B, S] (nonzero = token), whose row sums are the sequence lengths, or a jagged nested
        "input_ids", whose rows' lengths are (verl's padding-free engine batches: nested tensors
        and non-tensor entries are split as packsched.compat._rows.take_rows says).
    dp_group: the torch.distributed group whose ranks must agree on the micro-batch count
        (when ``same_micro_num_in_dp`` and torch.distributed is initialised); None, as in verl,
        agrees with no one (each rank keeps its own count: pass ``dist.group.WORLD`` for the
        default group); with a sidecar configured (``use_sidecar``) the sidecars agree instead.
    num_batches_divided_by: the count is a multiple of this (virtual pipeline stages).
    min_num_micro_batch: at least this many micro-batches.
    use_dynamic_bsz_balance: True orders micro-batches as current verl does: small ones at both
        ends, large ones in the middle (fewer pipeline bubbles in warm-up and cool-down). verl
        sorts by cost, largest first, then takes every other one reversed followed by the rest;
        that is the planner's "interleave" order for an odd count and its mirror image for an
        even one, so the drop-in mirrors it then: the same rule, applied to packsched's parts.
        False keeps them in order of their first sequence.
    force_group_size: each run of this many consecutive rows stays in one micro-batch (verl's
        reward-model pairs); the batch size must be a multiple of it (ValueError otherwise). A
        group is planned as one unit of its summed tokens: the cap holds exactly, and the
        attention cost counts the group as one sequence of that length (verl sums its rows'
        workloads instead).

    Returns (micro_batches, micro_bsz_idx): the pieces of ``batch`` (same type; rows in index
    order) and the original row indices of each. A rank with fewer sequences than the agreed count
    gets empty micro-batches (zero rows); in-process that includes an empty batch, which the
    sidecar refuses instead (INVALID_ARGUMENT "lengths", on every rank of the round).

    In-process, a rank whose batch cannot be planned (a row without tokens, a bad option value)
    still takes part in the count's all-reduce, then raises its error; the other ranks of
    ``dp_group`` raise RuntimeError naming it, so none waits forever. Through a sidecar, such a
    rank's request still joins its round wherever the server can judge it (it fails the round on
    every rank); a request that cannot be built fails on this rank alone, and its peers' round
    ends at the sidecars' --collective_timeout naming the missing rank.
    """
    options = dict(
        min_micro_batches=min_num_micro_batch or 1,
        divisible_by=num_batches_divided_by or 1,
        order="interleave" if use_dynamic_bsz_balance else "index",
        overlong="isolate",
        cost=cost,
    )
    if _sidecar is not None:
        round_ = _sidecar.take_round()
        plan = _sidecar.client.plan(
            round_,
            _unit_lens(batch, force_group_size),
            max_token_len,
            stream=_sidecar.stream,
            same_micro_num_in_dp=same_micro_num_in_dp,
            **options,
        )
    else:
        seq_lens = None

        def local_count():
            nonlocal seq_lens
            seq_lens = _unit_lens(batch, force_group_size)
            return planner.local_bound(seq_lens, max_token_len, **options).k

        if same_micro_num_in_dp and dp_group is not None:
            k = agree_max(local_count, dp_group, "rearrange_micro_batches")
        else:
            k = local_count()
        plan = planner.partition(seq_lens, k, max_token_len, **options)
    size = force_group_size
    micro_bsz_idx = [
        [group * size + j for group in groups for j in range(size)] for groups in plan.micro_batches
    ]
    if use_dynamic_bsz_balance and len(micro_bsz_idx) % 2 == 0:
        micro_bsz_idx.reverse()  # verl's placement for an even count (see the docstring)
    return [take_rows(batch, indices) for indices in micro_bsz_idx], micro_bsz_idx


def prepare_dynamic_batch(
    data,
    max_token_len,
    dp_group=None,
    num_batches_divided_by=None,
    same_micro_num_in_dp=True,
    min_num_micro_batch=None,
    use_dynamic_bsz_balance=True,
    *,
    cost="attention",
):
    """verl's ``prepare_dynamic_batch`` for a ``DataProto``: ``rearrange_micro_batches`` on
    ``data.batch``, then one DataProto per micro-batch (built with ``type(data).from_dict``) with
    its tensors, its rows of every ``non_tensor_batch`` array and a deep copy of ``meta_info``.
    Returns (micro-batch DataProtos, micro_bsz_idx). verl's newer ``padding_mode`` variants are
    not offered: this is the default, padding-free one."""
    micro_batches, micro_bsz_idx = rearrange_micro_batches(
        data.batch,
        max_token_len,
        dp_group,
        num_batches_divided_by,
        same_micro_num_in_dp,
        min_num_micro_batch,
        use_dynamic_bsz_balance,
        cost=cost,
    )
    protos = []
    for piece, indices in zip(micro_batches, micro_bsz_idx):
        non_tensors = {key: value[indices] for key, value in data.non_tensor_batch.items()}
        protos.append(
            type(data).from_dict(
                tensors=dict(piece),
                non_tensors=non_tensors,
                meta_info=copy.deepcopy(data.meta_info),
            )
        )
    return protos, micro_bsz_idx


def restore_dynamic_batch(data, batch_idx_list):
    """Puts ``data`` (the micro-batches' outputs concatenated on dim 0) back in original order,
    given the ``micro_bsz_idx`` lists that ``rearrange_micro_batches`` returned. A nested (jagged)
    ``data`` comes back nested; on a torch without the jagged layout it raises ValueError."""
    import torch

    if data.is_nested and (jagged() is None or data.layout != jagged()):
        _refuse_nested("restore_dynamic_batch's data")
    indices = [index for indices in batch_idx_list for index in indices]
    count = data.shape[0]
    if len(indices) != count:
        raise ValueError(f"restore_dynamic_batch: {len(indices)} indices for {count} rows")
    revert = get_reverse_idx(indices)
    if data.is_nested:
        return take_rows(data, revert)
    return data[torch.as_tensor(revert, dtype=torch.long, device=data.device)]


def _refuse_nested(what):
    import torch

    raise ValueError(
        f"{what} is a nested tensor: packsched reads nested input only in torch's jagged layout "
        f"(torch >= 2.2; this is torch {torch.__version__}): pass a jagged tensor, or a padded "
        "batch with an attention_mask"
    )


def _seq_lens(batch):
    """Tokens per row: of a nested (jagged) ``input_ids`` its rows' lengths, as verl reads them;
    otherwise the nonzero entries of each row of the [B, S] attention mask (B may be 0: flatten
    keeps the 0 rows, where reshape(0, -1) cannot infer S)."""
    input_ids = batch.get("input_ids") if hasattr(batch, "get") else None
    if getattr(input_ids, "is_nested", False):
        if jagged() is None or input_ids.layout != jagged():
            _refuse_nested("input_ids")
        return input_ids.offsets().diff()
    return batch["attention_mask"].flatten(1).ne(0).sum(dim=1)


def _unit_lens(batch, group_size):
    """Tokens per planning unit: per row, or per run of ``group_size`` consecutive rows."""
    lengths = _seq_lens(batch)
    if group_size == 1:
        return lengths
    if group_size < 1 or len(lengths) % group_size:
        raise ValueError(
            f"force_group_size = {group_size}: the batch's {len(lengths)} rows must be a "
            "positive multiple of it"
        )
    return lengths.reshape(-1, group_size).sum(dim=1)
