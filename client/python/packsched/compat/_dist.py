"""The small torch.distributed step the drop-ins share: agree on a count over a process group."""

# What a rank that could not compute its count contributes instead (plus its rank in the group,
# so the MAX names the highest failing rank). Far above any real count (the planner's limit is
# below 2^27), so the MAX of a round with a failure is always a sentinel.
FAILED_BASE = 1 << 62


def all_reduce_max(value, group):
    """Max of ``value`` over ``group`` (None = the default group) when torch.distributed is
    initialised; ``value`` itself otherwise. The tensor lives where the group's backend wants it
    (CUDA for NCCL, CPU otherwise)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return int(value)
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def agree_max(compute, group, what):
    """MAX over ``group`` of ``compute()`` (a count >= 0), such that no rank is left waiting:
    a rank whose ``compute()`` raises still takes part in the all-reduce, with a sentinel, and
    then raises its own exception; every other rank then raises RuntimeError naming ``what`` and
    the failing rank. Without an initialised torch.distributed, just ``compute()``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return compute()
    error = None
    try:
        value = compute()
    except Exception as e:  # re-raised below, after the collective
        error, value = e, FAILED_BASE + dist.get_rank(group)
    agreed = all_reduce_max(value, group)
    if error is not None:
        raise error
    if agreed >= FAILED_BASE:
        raise RuntimeError(
            f"{what}: rank {agreed - FAILED_BASE} of the process group (the highest failing "
            "one) could not compute its count and raised its error there; every rank stops here "
            "instead of waiting for it"
        )
    return agreed
