"""Drop-ins for OpenRLHF's dynamic batching (``openrlhf.utils.seqlen_balancing``).

    from packsched.compat.openrlhf import (get_minimum_num_micro_batch_size,
                                           get_seqlen_balanced_partitions, get_reverse_idx)

Same signatures and return values. ``get_minimum_num_micro_batch_size`` returns packsched's
local bound: the smallest count the planner finds for which a partition exists that keeps every
micro-batch within the capacity. OpenRLHF then calls ``get_seqlen_balanced_partitions(lengths, k,
False)``, which carries no cap; so that this call keeps the capacity too, the count call
remembers its last (lengths, capacity, count), and a partition of the very same lengths into at
least that many parts, without ``equal_size`` or an explicit ``max_token_len``, applies that
capacity. Any other call balances token sums only, as OpenRLHF's does (no cap guarantee).
"""

import threading

from .. import planner
from ._indices import get_reverse_idx

__all__ = ["get_minimum_num_micro_batch_size", "get_seqlen_balanced_partitions", "get_reverse_idx"]

_last_count = None  # (tuple of lengths, capacity, count) of the latest count call
_lock = threading.Lock()


def get_minimum_num_micro_batch_size(
    total_lengths, max_tokens_per_gpu, ring_attn_size=1, ds_tensor_parallel_size=1
):
    """The smallest micro-batch count packsched finds that keeps each micro-batch within
    max_tokens_per_gpu * ring_attn_size * ds_tensor_parallel_size tokens. Raises ValueError for a
    sequence longer than that capacity (as OpenRLHF does). Remembers (lengths, capacity, count)
    for the partition call that follows (see the module docstring)."""
    global _last_count
    lengths = [int(x) for x in total_lengths]
    capacity = max_tokens_per_gpu * ring_attn_size * ds_tensor_parallel_size
    count = planner.local_bound(lengths, capacity).k
    with _lock:
        _last_count = (tuple(lengths), capacity, count)
    return count


def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size, *, max_token_len=None):
    """Splits ``seqlen_list`` into exactly ``k_partitions`` lists of indices (each sorted) with
    balanced token sums; with ``equal_size`` each gets len / k sequences. Every part also stays
    within ``max_token_len`` when it is given (k must then be at least the bound) or, without it,
    within the capacity of the latest get_minimum_num_micro_batch_size call when that call counted
    the same lengths and k is at least its count (and not ``equal_size``). Raises ValueError when
    k exceeds the number of sequences (a part would be empty)."""
    lengths = [int(x) for x in seqlen_list]
    if k_partitions > len(lengths):
        raise ValueError(
            f"k_partitions = {k_partitions} exceeds the {len(lengths)} sequences: "
            "a partition would be empty"
        )
    if max_token_len is None and not equal_size:
        with _lock:
            last = _last_count
        if last is not None and last[0] == tuple(lengths) and k_partitions >= last[2]:
            max_token_len = last[1]
    plan = planner.partition(lengths, k_partitions, max_token_len, equal_size=equal_size)
    return [list(indices) for indices in plan.micro_batches]
