"""Drop-ins for verl's dynamic batching (``verl.utils.seqlen_balancing``).

    from packsched.compat.verl import rearrange_micro_batches, get_reverse_idx, restore_dynamic_batch

Same signatures and return values as verl's functions. What changes: verl picks
k = ceil(total / max_token_len), which is often infeasible, so its Karmarkar–Karp partitions
leave micro-batches over the cap; packsched picks the smallest k it can prove feasible (the max
over the DP group, like verl) and never exceeds the cap unless one sequence alone does (that
sequence then runs alone). Balancing uses packsched's attention-aware cost
(24576·L + L², like verl's workload estimate) unless ``cost="tokens"`` is passed.
"""

from collections.abc import Mapping

from .. import planner
from ._dist import all_reduce_max

__all__ = ["rearrange_micro_batches", "get_reverse_idx", "restore_dynamic_batch", "use_sidecar"]

_sidecar = None  # (SchedulerClient, stream, [next round]) once use_sidecar() was called


def use_sidecar(client, stream="verl", first_round=0):
    """Plans through this rank's packsched sidecar instead of the in-process planner plus a
    torch.distributed all-reduce: the sidecars agree the count (``dp_group`` is then ignored).
    Every rank must make the same sequence of rearrange_micro_batches calls: the n-th call of each
    rank is round first_round + n of ``stream``. ``client=None`` switches back."""
    global _sidecar
    _sidecar = None if client is None else (client, stream, [int(first_round)])


def rearrange_micro_batches(
    batch,
    max_token_len,
    dp_group=None,
    num_batches_divided_by=None,
    same_micro_num_in_dp=True,
    min_num_micro_batch=None,
    use_dynamic_bsz_balance=True,
    *,
    cost="attention",
):
    """Splits ``batch`` into micro-batches of at most ``max_token_len`` real tokens each.

    batch: a TensorDict or a mapping of tensors indexed on dim 0, with "attention_mask"
        [B, S] (nonzero = token); the sequence lengths are its row sums.
    dp_group: the torch.distributed group whose ranks must agree on the micro-batch count
        (when ``same_micro_num_in_dp`` and torch.distributed is initialised); with a sidecar
        configured (``use_sidecar``) the sidecars agree instead.
    num_batches_divided_by: the count is a multiple of this (virtual pipeline stages).
    min_num_micro_batch: at least this many micro-batches.
    use_dynamic_bsz_balance: True orders micro-batches by cost, largest first (as verl sorts
        them); False keeps them in order of their first sequence.

    Returns (micro_batches, micro_bsz_idx): the pieces of ``batch`` (same type; rows in index
    order) and the original row indices of each. A rank with fewer sequences than the agreed count
    gets empty micro-batches (zero rows).
    """
    mask = batch["attention_mask"]
    seq_lens = mask.reshape(mask.shape[0], -1).ne(0).sum(dim=1)
    options = dict(
        min_micro_batches=min_num_micro_batch or 1,
        divisible_by=num_batches_divided_by or 1,
        order="cost_desc" if use_dynamic_bsz_balance else "index",
        overlong="isolate",
        cost=cost,
    )
    if _sidecar is not None:
        client, stream, next_round = _sidecar
        plan = client.plan(next_round[0], seq_lens, max_token_len, stream=stream,
                           same_micro_num_in_dp=same_micro_num_in_dp, **options)
        next_round[0] += 1
    else:
        k = planner.local_bound(seq_lens, max_token_len, **options).k
        if same_micro_num_in_dp:
            k = all_reduce_max(k, dp_group)
        plan = planner.partition(seq_lens, k, max_token_len, **options)
    micro_bsz_idx = [list(indices) for indices in plan.micro_batches]
    return [_select(batch, indices) for indices in micro_bsz_idx], micro_bsz_idx


def get_reverse_idx(idx_map):
    """For a permutation ``idx_map`` (position -> original index), the inverse list
    (original index -> position)."""
    reverse = [0] * len(idx_map)
    for position, index in enumerate(idx_map):
        reverse[index] = position
    return reverse


def restore_dynamic_batch(data, batch_idx_list):
    """Puts ``data`` (the micro-batches' outputs concatenated on dim 0) back in original order,
    given the ``micro_bsz_idx`` lists that ``rearrange_micro_batches`` returned."""
    import torch

    indices = [index for indices in batch_idx_list for index in indices]
    if len(indices) != data.shape[0]:
        raise ValueError(f"restore_dynamic_batch: {len(indices)} indices for {data.shape[0]} rows")
    revert = torch.as_tensor(get_reverse_idx(indices), dtype=torch.long, device=data.device)
    return data[revert]


def _select(batch, indices):
    import torch

    if isinstance(batch, Mapping) and not hasattr(batch, "batch_size"):
        first = next(iter(batch.values()))
        index = torch.as_tensor(indices, dtype=torch.long, device=first.device)
        return type(batch)({key: value.index_select(0, index) for key, value in batch.items()})
    # A TensorDict: indexing with a tensor of rows selects them in every entry.
    return batch[torch.as_tensor(indices, dtype=torch.long, device=batch.device)]
