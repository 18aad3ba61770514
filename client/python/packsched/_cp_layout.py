"""The host-side shard layout of context parallelism (pure arithmetic on a plan's offsets): shared
by packsched.plan (MicroBatchMeta.cp_layout) and packsched.kernels (cp_layout).

Head-tail layout: with ``cp`` ranks every sequence of an aligned micro-batch (each length a
multiple of 2 * cp) is cut into 2 * cp chunks of length / (2 * cp) rows; CP rank c holds, for
every sequence in order, chunk c followed by chunk 2 * cp - 1 - c.
"""


def check_cp(cp, rank=None):
    """cp as an int >= 1 (and rank in [0, cp) when given); ValueError otherwise."""
    cp = int(cp)
    if cp < 1:
        raise ValueError(f"cp must be >= 1, got {cp}")
    if rank is not None and not 0 <= int(rank) < cp:
        raise ValueError(f"rank must be in [0, cp = {cp}), got {rank}")
    return cp


def chunk_lengths(host, cp):
    """Per sequence of the offsets ``host`` its chunk length (length / (2 cp)); ValueError unless
    every length is a multiple of 2 * cp."""
    chunks = []
    for b, (start, stop) in enumerate(zip(host, host[1:])):
        if (stop - start) % (2 * cp) != 0:
            raise ValueError(
                f"cu_seqlens: sequence {b} has length {stop - start}, not a multiple of "
                f"2 * cp = {2 * cp} (align it: align_to = 2 * cp * tp)"
            )
        chunks.append((stop - start) // (2 * cp))
    return chunks


def segment_rows(length, cp, rank):
    """The rows of one segment (a sequence, or later a tree-packed row) of ``length`` rows (a
    multiple of 2 * cp) that member ``rank`` of a CP group of ``cp`` ranks holds, relative to the
    segment's start and in shard order: [(rank * m, (rank + 1) * m), ((2cp - 1 - rank) * m,
    (2cp - rank) * m)] with m = length / (2 cp); none for an empty segment. Any cp >= 1. Under
    causal attention by position every member then does the same work. This map is the whole
    shard contract: the shard of a micro-batch is its segments' rows in segment order, and a
    member's attention needs, for each of its queries, the keys of its segment that the mask lets
    it see (a causal prefix here), which an all-gather of the group's shards provides."""
    cp = check_cp(cp, rank)
    if length % (2 * cp) != 0:
        raise ValueError(f"segment length {length} is not a multiple of 2 * cp = {2 * cp}")
    m = length // (2 * cp)
    if m == 0:
        return []
    return [(c * m, (c + 1) * m) for c in (rank, 2 * cp - 1 - rank)]


def cp_layout(cu_seqlens, cp, rank):
    """The shard layout of CP rank ``rank`` for an aligned micro-batch whose offsets are
    ``cu_seqlens`` (B + 1 ints, every length a multiple of 2 * cp): what an all-gather (or ring)
    CP attention needs on the host, with no device sync. Returns a dict:

    - ``row_ranges``: the [start, stop) rows of the full micro-batch this rank holds, in shard
      order (per sequence its head chunk, then its tail chunk; empty sequences give none);
    - ``cu_seqlens_q``: the local offsets of the shard's queries (cu_seqlens / cp);
    - ``cu_seqlens_k``: the global offsets of the keys (cu_seqlens itself);
    - ``max_seqlen_q`` / ``max_seqlen_k``: the longest local resp. global sequence;
    - ``positions``: per shard row its position in its sequence (total / cp ints);
    - ``rows``: total / cp.
    """
    cp = check_cp(cp, rank)
    host = [int(v) for v in cu_seqlens]
    chunks = chunk_lengths(host, cp)
    ranges, positions = [], []
    for start, chunk in zip(host, chunks):
        for a, b in segment_rows(2 * cp * chunk, cp, rank):
            ranges.append((start + a, start + b))
            positions.extend(range(a, b))
    lengths = [b - a for a, b in zip(host, host[1:])]
    return {
        "row_ranges": ranges,
        "cu_seqlens_q": [v // cp for v in host],
        "cu_seqlens_k": list(host),
        "max_seqlen_q": max(lengths, default=0) // cp,
        "max_seqlen_k": max(lengths, default=0),
        "positions": positions,
        "rows": host[-1] // cp,
    }
