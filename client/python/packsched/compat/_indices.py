"""Index helpers the verl and OpenRLHF drop-ins share (kept apart so neither imports the other's
module at import time)."""


def get_reverse_idx(idx_map):
    """For a permutation ``idx_map`` (position -> original index), the inverse (original index ->
    position), of the same kind as upstream's copy-then-assign gives: a torch tensor or numpy
    array gives one of its dtype (and device), anything else a list."""
    if type(idx_map).__module__.startswith("torch"):
        import torch

        reverse = torch.empty_like(idx_map)
        reverse[idx_map] = torch.arange(len(idx_map), dtype=idx_map.dtype, device=idx_map.device)
        return reverse
    if type(idx_map).__module__ == "numpy":
        import numpy as np

        reverse = np.empty_like(idx_map)
        reverse[idx_map] = np.arange(len(idx_map), dtype=idx_map.dtype)
        return reverse
    reverse = [0] * len(idx_map)
    for position, index in enumerate(idx_map):
        reverse[index] = position
    return reverse
