"""Context parallelism for tree-packed micro-batches: the tree shard map and the kernels around it
(re-exported by packsched.tree_kernels; docs/design.md, "Context parallelism" and "Tree packing").

The contract is the one of flat CP (packsched._cp_layout.segment_rows): per segment (a piece, or
the tail), group size cp and member rank, the rows the member holds, relative to the segment's
start and in shard order; the shard of a micro-batch is its segments' rows in segment order, and a
member's query sees exactly the keys the mask of its segment lets the same row see unsharded (for a
tree: j <= i < subtree_end[j]), which an all-gather of the group's shards provides.

The tree map: a segment of L rows (a multiple of 2 * cp) gives each member L / cp rows, a head
run and a tail run as flat CP's head-tail chunks are, but of the lengths that balance the work: a
query row i works in proportion to the keys it sees, positions[i] + 1 (its depth plus one: the
rows on its root path). Members take their runs from the outside in, each the split whose work is
nearest an equal share of what is left (tree_segment_rows). For a flat segment that split is the
middle, and the map is segment_rows' head-tail map, row for row.
"""

import numpy as np

from ._cp_layout import check_cp

__all__ = [
    "tree_segment_rows",
    "tree_cp_rows",
    "tree_cp_shard",
    "tree_cp_unshard",
    "tree_cp_attention",
    "tree_cp_targets",
    "tree_cp_cross_entropy",
    "tree_cp_work",
]


def tree_segment_rows(positions, cp, rank):
    """The rows of one tree segment that member ``rank`` of a CP group of ``cp`` ranks holds:
    ``positions`` are the segment's depths (int [L], L a multiple of 2 * cp), the result is a
    list of (start, stop) ranges relative to the segment's start, ascending: a head run and a tail
    run of L / cp rows together (an empty run left out; none for an empty segment). ValueError for
    a bad cp, rank or length.

    Members take their runs from the outside in: member c, given the rows [lo, hi) the members
    before it left, takes [lo, lo + a) and [hi - (L / cp - a), hi) with the a in [0, L / cp]
    whose work (positions + 1 summed) is nearest the remaining work / (cp - c), ties to the a
    nearest L / (2 cp). On a flat segment the work is strictly monotone in a and a = L / (2 cp)
    hits the target exactly, so this is segment_rows' head-tail map row for row."""
    cp = check_cp(cp, rank)
    work = np.asarray(positions, dtype=np.int64).reshape(-1) + 1
    length = len(work)
    if length % (2 * cp) != 0:
        raise ValueError(f"segment length {length} is not a multiple of 2 * cp = {2 * cp}")
    n = length // cp
    if n == 0:
        return []
    prefix = np.concatenate([[0], np.cumsum(work)])
    a = np.arange(n + 1)
    lo, hi = 0, length
    for member in range(rank + 1):
        remaining = int(prefix[hi] - prefix[lo])
        held = (prefix[lo + a] - prefix[lo]) + (prefix[hi] - prefix[hi - n + a])
        # |held - remaining / (cp - member)|, in integers; then the distance from the middle.
        take = int(a[np.lexsort((np.abs(2 * a - n), np.abs(held * (cp - member) - remaining)))[0]])
        if member == rank:
            return [r for r in ((lo, lo + take), (hi - (n - take), hi)) if r[1] > r[0]]
        lo, hi = lo + take, hi - (n - take)
    raise AssertionError("unreachable")


def _host_list(values):
    if hasattr(values, "tolist"):
        return [int(v) for v in values.tolist()]
    return [int(v) for v in values]


def _segments(cu_seqlens, total):
    """The [start, stop) segments of a micro-batch: its pieces, then its tail if any."""
    host = _host_list(cu_seqlens)
    bounds = list(zip(host, host[1:]))
    if total is not None and int(total) > host[-1]:
        bounds.append((host[-1], int(total)))
    return bounds


def tree_cp_rows(cu_seqlens, positions, cp, rank, total=None):
    """The row map of CP rank ``rank``: the global rows of the micro-batch it holds, in shard
    order (int64 numpy [rows / cp]). ``cu_seqlens``: the aligned piece offsets (host ints),
    ``positions``: every row's depth (int [rows]); ``total``: the rows with a tail (default
    cu_seqlens[-1]; the tail is one more segment). Every segment's length must be a multiple of
    2 * cp (plan with context_parallel = cp; a tail with align_total_to a multiple of 2 * cp)."""
    cp = check_cp(cp, rank)
    pos = np.asarray(_host_list(positions), dtype=np.int64)
    out = []
    for b, (start, stop) in enumerate(_segments(cu_seqlens, total)):
        if (stop - start) % (2 * cp) != 0:
            raise ValueError(
                f"cu_seqlens: segment {b} has length {stop - start}, not a multiple of "
                f"2 * cp = {2 * cp} (plan the forest with context_parallel = {cp})"
            )
        for a, z in tree_segment_rows(pos[start:stop], cp, rank):
            out.append(np.arange(start + a, start + z, dtype=np.int64))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def tree_cp_work(cu_seqlens, positions, cp, total=None):
    """Per CP rank the attention work of its queries under the tree mask (the sum over its rows
    of positions + 1): an int list of cp entries."""
    pos = np.asarray(_host_list(positions), dtype=np.int64)
    return [int((pos[tree_cp_rows(cu_seqlens, pos, cp, r, total)] + 1).sum()) for r in range(cp)]


def _index(rows, like):
    import torch

    return torch.as_tensor(np.asarray(rows, dtype=np.int64), device=like.device)


def tree_cp_shard(x, rows):
    """The rank's shard of ``x`` (rows are dimension 0; torch or numpy): x[rows] for its row map
    ``rows`` (tree_cp_rows). Differentiable for torch."""
    if isinstance(x, np.ndarray):
        return x[np.asarray(rows, dtype=np.int64)]
    return x.index_select(0, _index(rows, x))


def tree_cp_unshard(shards, row_maps, total=None):
    """The inverse of tree_cp_shard over the group: ``shards[r]`` is rank r's shard, ``row_maps[r]``
    its row map; returns the whole micro-batch (rows = the sum of the shards' rows, or ``total``).
    Every row must be held by exactly one rank (the maps of one tree_cp_rows call per rank are).
    Differentiable for torch (the gradient of a shard is its rows of the gradient)."""
    rows = sum(len(m) for m in row_maps) if total is None else int(total)
    seen = np.zeros(rows, dtype=np.int64)
    for m in row_maps:
        np.add.at(seen, np.asarray(m, dtype=np.int64), 1)
    if not (seen == 1).all():
        raise ValueError("row_maps: every row must be held by exactly one rank")
    if isinstance(shards[0], np.ndarray):
        out = np.empty((rows,) + shards[0].shape[1:], dtype=shards[0].dtype)
        for s, m in zip(shards, row_maps):
            out[np.asarray(m, dtype=np.int64)] = s
        return out
    import torch

    index = torch.cat([_index(m, shards[0]) for m in row_maps])
    stacked = torch.cat(list(shards))
    out = stacked.new_zeros((rows,) + tuple(stacked.shape[1:]))
    return out.index_copy(0, index, stacked)


# tree_attention's layout keywords and their defaults: what the query-row map path passes on.
_LAYOUT_DEFAULTS = dict(
    softmax_scale=None, window_left=-1, softcap=0.0, seqused=None, cu_seqlens_host=None, total=None
)


def tree_cp_attention(
    q_shard,
    k,
    v,
    rows,
    cu_seqlens,
    max_seqlen,
    subtree_end,
    positions=None,
    *,
    all_rows=False,
    **kwargs,
):
    """The shard's queries against the whole micro-batch's keys and values under the tree mask
    (differentiable, torch): q_shard [rows / cp, H, D] (the rank's rows, ``rows`` its map), k and
    v [rows, Hk, D] (all-gathered and tree_cp_unshard-ed), cu_seqlens, max_seqlen, subtree_end,
    positions and the keywords (softmax_scale, window_left, softcap, seqused, cu_seqlens_host,
    total) as tree_attention takes them for the whole micro-batch. Returns [rows / cp, H, D]:
    row for row the unsharded tree_attention's output at the rank's rows.

    It scatters the shard's queries into a zero query buffer of the whole micro-batch, runs the
    tree attention and keeps the rank's rows. That is exact: a row's output depends on its own
    query only, and the rows not kept get a zero output gradient, so their share of the key and
    value gradients is exactly zero. The gradients of k and v are this rank's contribution (sum
    them over the group: the all-gather's backward). The call carries the rank's rows as its
    query-row map (attention.h: AttentionSeqlens::query_rows; a host tensor, on the CPU and on
    CUDA), so it computes only those queries (on CUDA the query tiles holding one of them), each
    against the keys it sees (its ancestors), bitwise what the unsharded call gives them;
    ``all_rows=True`` and other keywords of tree_attention (backend) compute every row, as the
    unsharded call costs."""
    from . import _arrays
    from .tree_kernels import tree_attention

    index = _index(rows, q_shard)
    full = q_shard.new_zeros((k.shape[0],) + tuple(q_shard.shape[1:]))
    full = full.index_copy(0, index, q_shard)
    if all_rows or not set(kwargs) <= set(_LAYOUT_DEFAULTS):
        # Every row (other keywords, such as backend, are tree_attention's to honour or refuse).
        out = tree_attention(full, k, v, cu_seqlens, max_seqlen, subtree_end, positions, **kwargs)
    else:
        import torch

        params = dict(_LAYOUT_DEFAULTS, **kwargs)
        params.update(
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            subtree_end=subtree_end,
            positions=positions,
            query_rows=torch.as_tensor(np.sort(np.asarray(rows, dtype=np.int64)).astype(np.int32)),
        )
        out, _ = _arrays._torch_ops().tree_attention(full, k, v, params)
    return out.index_select(0, index)


def tree_cp_targets(targets, rows):
    """The rank's targets: those of ``targets`` (a TreeTargets of the whole micro-batch, built
    before sharding, so a label may be a token held by another rank) whose row the rank holds,
    their rows local to the shard and sorted. Returns a TreeTargets whose ``index`` is, per kept
    target, its index in ``targets`` (to restore per-target values over the group)."""
    from .tree_kernels import TreeTargets

    rows = np.asarray(rows, dtype=np.int64)
    t_rows = np.asarray(targets.rows, dtype=np.int64)
    local = np.full(int(max(rows.max(initial=-1), t_rows.max(initial=-1))) + 1, -1, np.int64)
    local[rows] = np.arange(len(rows), dtype=np.int64)
    keep = np.nonzero(local[t_rows] >= 0)[0]
    mine = local[t_rows[keep]]
    order = np.lexsort((np.asarray(targets.labels)[keep], mine))
    keep = keep[order]
    return TreeTargets(
        np.ascontiguousarray(local[t_rows[keep]]),
        np.ascontiguousarray(np.asarray(targets.labels, dtype=np.int64)[keep]),
        np.ascontiguousarray(np.asarray(targets.weights, dtype=np.float64)[keep]),
        keep,
    )


def tree_cp_cross_entropy(logits_shard, shard_targets):
    """The rank's weighted loss: sum over its targets (tree_cp_targets) of weight * CE(logits of
    the local row, label), and each target's cross entropy. Summed over the CP group it is the
    micro-batch's weighted loss. -> (loss, per-target losses)"""
    import torch

    from .tree_kernels import multi_target_cross_entropy

    device = logits_shard.device
    loss = multi_target_cross_entropy(
        logits_shard,
        torch.as_tensor(shard_targets.rows, device=device),
        torch.as_tensor(shard_targets.labels, device=device),
    )
    weights = torch.as_tensor(shard_targets.weights, dtype=loss.dtype, device=device)
    return (loss * weights).sum(), loss
