"""The small torch.distributed step the drop-ins share: agree on a count over a process group."""


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
