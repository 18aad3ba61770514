"""slime's scheduling entry points: the whole global batch to per-rank micro-batches in one call.

    from packsched.compat.slime import build_dp_schedule  # slime.utils.dp_schedule's, swapped in

``build_dp_schedule`` takes slime's arguments and returns slime's 4-tuple, so a slime user swaps
one import; packsched decides the micro-batches (see its docstring). Where slime asserts, it
raises ``PackschedSlimeError``, both a ValueError and an AssertionError, so slime's callers catch
it as they catch slime's. ``split_global_batch`` is
packsched's own entry point:

slime counts micro-batches by first fit under ``max_tokens_per_gpu`` and then deals the bins to
the data-parallel ranks. ``split_global_batch`` plans the same thing with packsched's coordinator
mode (``packsched.planner.balance``), by default under ``sync="micro_batch"``: micro-batch i of
every rank costs nearly the same, which is what a step costs when ranks meet at every
micro-batch (FSDP / ZeRO-3, pipeline or context parallelism; docs/design.md §2, "Coordinator
mode's sync"). Every micro-batch keeps the cap, every rank gets the same count, and that count is
at most the first-fit-decreasing bins of the global batch over the ranks, rounded up.
"""

import warnings

from .. import planner
from ._slime_schedule import PackschedSlimeError, build_dp_schedule

__all__ = [
    "build_dp_schedule",
    "split_global_batch",
    "get_minimum_num_micro_batch_size",
    "PackschedSlimeError",
]


def get_minimum_num_micro_batch_size(total_lengths, max_tokens_per_gpu):
    """Deprecated: slime removed this function (its count is now part of ``build_dp_schedule``).
    The fewest micro-batches packsched finds that keep each within ``max_tokens_per_gpu`` tokens
    (never more than first fit's). Raises ValueError for a sequence longer than the cap."""
    warnings.warn(
        "get_minimum_num_micro_batch_size follows a function slime removed; use "
        "build_dp_schedule (slime's current entry point) or packsched.planner.local_bound",
        DeprecationWarning,
        stacklevel=2,
    )
    return planner.local_bound(total_lengths, max_tokens_per_gpu).k


def split_global_batch(
    total_lengths,
    dp_size,
    max_tokens_per_gpu,
    *,
    cp_size=1,
    sync="micro_batch",
    group_ids=None,
    num_micro_batches_divisible_by=1,
    micro_batch_cost=0,
    cost="attention",
    **options,
):
    """Splits the global batch (``total_lengths``: tokens per sequence) over ``dp_size`` ranks.

    The cap is ``max_tokens_per_gpu * cp_size`` tokens per micro-batch (a context-parallel group
    shares one micro-batch, as slime counts it). ``sync``: "micro_batch" (default) balances every
    slot over the ranks, "step" each rank's total (plain DDP). ``group_ids``: sequences with the
    same id stay on one rank (GRPO groups, shared prefixes). ``num_micro_batches_divisible_by``:
    the count is a multiple of it (virtual pipeline stages). ``micro_batch_cost``: a fixed cost
    per non-empty micro-batch; ``cost`` and further keyword ``options`` as in
    ``packsched.planner.balance`` (e.g. ``model_config``, ``overlong``).

    Returns a list over ranks of a list over micro-batch slots of the global indices in that
    micro-batch (ascending): ``result[r][i]`` is what rank r runs in slot i. Every rank has the
    same number of slots; a slot may be empty on some ranks (run it as an empty micro-batch so
    the ranks stay in step).
    """
    balanced = planner.balance(
        total_lengths,
        dp_size,
        max_tokens_per_gpu * cp_size,
        group_ids=group_ids,
        sync=sync,
        micro_batch_cost=micro_batch_cost,
        divisible_by=num_micro_batches_divisible_by,
        cost=cost,
        **options,
    )
    return [
        [sorted(rank.indices[p] for p in part) for part in rank.plan.micro_batches]
        for rank in balanced.ranks
    ]
