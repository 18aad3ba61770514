"""Drop-ins for OpenRLHF's dynamic batching (``openrlhf.utils.seqlen_balancing``).

    from packsched.compat.openrlhf import (get_minimum_num_micro_batch_size,
                                           get_seqlen_balanced_partitions, get_reverse_idx)

Same signatures and return values. ``get_minimum_num_micro_batch_size`` returns packsched's
local bound — a count the partition below can always meet within the cap (OpenRLHF's first-fit
count comes with no such guarantee for the Karmarkar–Karp partition that follows).
"""

from .. import planner
from .verl import get_reverse_idx

__all__ = ["get_minimum_num_micro_batch_size", "get_seqlen_balanced_partitions", "get_reverse_idx"]


def get_minimum_num_micro_batch_size(total_lengths, max_tokens_per_gpu, ring_attn_size=1,
                                     ds_tensor_parallel_size=1):
    """The smallest micro-batch count packsched finds that keeps each micro-batch within
    max_tokens_per_gpu * ring_attn_size * ds_tensor_parallel_size tokens. Raises ValueError for a
    sequence longer than that capacity (as OpenRLHF does)."""
    capacity = max_tokens_per_gpu * ring_attn_size * ds_tensor_parallel_size
    return planner.local_bound(list(total_lengths), capacity).k


def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size, *, max_token_len=None):
    """Splits ``seqlen_list`` into exactly ``k_partitions`` lists of indices (each sorted) with
    balanced token sums; with ``equal_size`` each gets len / k sequences. With
    ``max_token_len`` the partition also keeps every part within that cap (k must then be at least
    the bound). Raises ValueError when k exceeds the number of sequences (a part would be empty)."""
    if k_partitions > len(seqlen_list):
        raise ValueError(
            f"k_partitions = {k_partitions} exceeds the {len(seqlen_list)} sequences: "
            "a partition would be empty"
        )
    plan = planner.partition(list(seqlen_list), k_partitions, max_token_len, equal_size=equal_size)
    return [list(indices) for indices in plan.micro_batches]
