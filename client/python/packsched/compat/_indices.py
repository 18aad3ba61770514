"""Index helpers the verl and OpenRLHF drop-ins share (kept apart so neither imports the other's
module at import time)."""


def get_reverse_idx(idx_map):
    """For a permutation ``idx_map`` (position -> original index), the inverse list
    (original index -> position)."""
    reverse = [0] * len(idx_map)
    for position, index in enumerate(idx_map):
        reverse[index] = position
    return reverse
