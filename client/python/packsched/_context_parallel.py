"""Context parallelism (CP) over packed micro-batches, and 3-D rotary positions; re-exported by
packsched.kernels (see its module docstring and docs/design.md, "Context parallelism").

Head-tail layout: with ``cp`` ranks every sequence of an aligned micro-batch (each length a
multiple of 2 * cp: the plan's ``cu_seqlens_aligned`` with ``align_to = 2 * cp * tp``) is cut
into 2 * cp chunks of length / (2 * cp) rows; CP rank c holds, for every sequence in order, chunk c
followed by chunk 2 * cp - 1 - c. Its shard has total / cp rows, sequence b in local rows
[cu_seqlens[b] / cp, cu_seqlens[b + 1] / cp). Under causal attention every rank then does the
same work for every sequence.
"""

from . import _kernels
from ._cp_layout import check_cp as _check_cp
from ._cp_layout import chunk_lengths as _chunks
from ._cp_layout import cp_layout  # noqa: F401 (re-exported by packsched.kernels)
from ._arrays import _Torch, _host, _lib_of, _rows, _same_lib
from ._attention import varlen_attention
from ._cross_entropy import packed_cross_entropy
from ._packing import position_ids, shift_labels


def _host_list(lib, cu_seqlens, cu_seqlens_host):
    """The offsets as a list of ints: cu_seqlens_host, or cu_seqlens itself when it is a list,
    else a copy of the tensor (a sync for a device tensor)."""
    if cu_seqlens_host is None and isinstance(cu_seqlens, (list, tuple)):
        cu_seqlens_host = cu_seqlens
    if cu_seqlens_host is None:
        return _host(lib, _same_lib(lib, cu_seqlens), None)
    return [int(v) for v in cu_seqlens_host]


def cp_shard(x, cu_seqlens, cp, rank, cu_seqlens_host=None):
    """CP rank ``rank``'s rows of x ([total, ...], any dtype; rows are dimension 0): for each
    sequence of ``cu_seqlens`` (the aligned int32 offsets, every length a multiple of 2 * cp, else
    ValueError) its chunk ``rank`` followed by its chunk 2 * cp - 1 - ``rank`` (chunk = length /
    (2 * cp) rows). Returns [total / cp, ...] of x's dtype, on x's device. Not differentiable
    (torch inputs are detached); a trainer shards its inputs (ids, labels, positions)."""
    cp = _check_cp(cp, rank)
    lib, x = _lib_of(x)
    x = lib.contiguous(x)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    _chunks(host, cp)
    shard = lib.empty((host[-1] // cp,) + tuple(x.shape[1:]), None, x)
    _kernels.cp_shard(x, cu_seqlens, host, cp, int(rank), shard, lib.stream(x))
    return shard


def cp_unshard(shards, cu_seqlens, cp, cu_seqlens_host=None):
    """The inverse of cp_shard: ``shards`` is ``[cp_shard(x, cu_seqlens, cp, r) for r in
    range(cp)]`` (e.g. an all-gather's output); returns x exactly."""
    cp = _check_cp(cp)
    if len(shards) != cp:
        raise ValueError(f"cp_unshard: expected cp = {cp} shards, got {len(shards)}")
    lib, first = _lib_of(shards[0])
    shards = [_same_lib(lib, s) for s in shards]
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    _chunks(host, cp)
    x = lib.empty((host[-1],) + tuple(first.shape[1:]), None, shards[0])
    for rank, shard in enumerate(shards):
        _kernels.cp_unshard(shard, cu_seqlens, host, cp, rank, x, lib.stream(shard))
    return x


def cp_position_ids(cu_seqlens, cp, rank, cu_seqlens_host=None):
    """int64 [total / cp]: the position in its sequence of every row of rank's shard (pass the
    aligned offsets: pad slots continue the count, as position_ids does)."""
    full = position_ids(cu_seqlens, cu_seqlens_host=cu_seqlens_host)
    return cp_shard(full, cu_seqlens, cp, rank, cu_seqlens_host)


def cp_shift_labels(
    ids,
    cu_seqlens,
    cu_seqlens_padded,
    cp,
    rank,
    ignore_index=-100,
    cu_seqlens_host=None,
    cu_seqlens_padded_host=None,
):
    """Rank's shard of the shifted labels: ``ids`` is the full aligned micro-batch [total] (in
    the layout of ``cu_seqlens_padded``, real lengths in ``cu_seqlens``), shifted first (so no
    label crosses a sequence boundary or a chunk boundary: a head chunk's last label is the first
    token of the next chunk, held by another rank), then sharded. Returns [total / cp]."""
    labels = shift_labels(
        ids,
        cu_seqlens,
        ignore_index,
        cu_seqlens_padded,
        cu_seqlens_host,
        cu_seqlens_padded_host,
    )
    return cp_shard(labels, cu_seqlens_padded, cp, rank, cu_seqlens_padded_host)


def _index(torch, ranges, device):
    if not ranges:
        return torch.zeros(0, dtype=torch.long, device=device)
    return torch.cat([torch.arange(a, b, device=device) for a, b in ranges])


def cp_attention(q, k, v, cu_seqlens, cp, rank, softmax_scale=None, cu_seqlens_host=None):
    """Causal attention of CP rank ``rank``'s queries against all keys and values of their
    sequences, causal by global position (torch tensors; differentiable in q, k and v).

    q: [total / cp, H, D], the rank's shard (cp_shard's layout); k, v: [total, Hk, D], the whole
    micro-batch in global order (all-gather the ranks' shards and cp_unshard them);
    ``cu_seqlens``: the aligned offsets (every length a multiple of 2 * cp). Returns out
    [total / cp, H, D], equal to the shard of full causal varlen attention over the micro-batch.
    Pad slots at the end of an aligned sequence come after its real tokens, so under causal
    attention no real token sees them.

    Runs two varlen_attention calls (head chunks, tail chunks), each against a prefix of its
    sequence's keys (seqused_k = (rank + 1) resp. (2 cp - rank) chunks, bottom-right causal), so
    the gradients of k and v (summed over both calls) are this rank's contribution: a trainer
    reduce-scatters them over the CP group (the backward of its all-gather).
    """
    cp = _check_cp(cp, rank)
    lib, q = _lib_of(q)
    if not isinstance(lib, _Torch):
        raise TypeError("cp_attention takes torch tensors")
    torch = lib.torch
    host = _host_list(lib, cu_seqlens, cu_seqlens_host)
    chunks = _chunks(host, cp)
    device = q.device
    cu_k = torch.tensor(host, dtype=torch.int32, device=device)
    local = [v // cp for v in host]
    cu_q_host = [0]
    for c in chunks:
        cu_q_host.append(cu_q_host[-1] + c)
    cu_q = torch.tensor(cu_q_host, dtype=torch.int32, device=device)
    out = torch.zeros_like(q)
    for part, keys_of in ((0, rank + 1), (1, 2 * cp - rank)):
        ranges = [
            (start + part * c, start + (part + 1) * c) for start, c in zip(local, chunks) if c
        ]
        index = _index(torch, ranges, device)
        seqused_k = torch.tensor([keys_of * c for c in chunks], dtype=torch.int32, device=device)
        half = varlen_attention(
            q.index_select(0, index),
            k,
            v,
            cu_q,
            cu_k,
            max(chunks, default=0),
            host[-1] and max(b - a for a, b in zip(host, host[1:])),
            softmax_scale=softmax_scale,
            causal=True,
            seqused_k=seqused_k,
            cu_seqlens_q_host=cu_q_host,
            cu_seqlens_k_host=host,
        )
        out = out.index_copy(0, index, half)
    return out


def cp_cross_entropy(
    logits, labels, cu_seqlens, cp, loss_weights=None, ignore_index=-100, cu_seqlens_host=None
):
    """Cross entropy of one CP rank's shard, weighted per sequence.

    logits: [total / cp, V] and labels [total / cp] in the shard's layout (cp_shift_labels);
    ``cu_seqlens``: the full micro-batch's aligned offsets (a list or an int32 tensor; the shard's
    are cu_seqlens / cp); ``loss_weights``: B floats (the plan's loss_weights of the micro-batch's
    sequences; default 1). Returns (loss, per_sequence_sum, per_sequence_count): loss =
    sum_b loss_weights[b] * per_sequence_sum[b] over this rank's tokens (a 0-d tensor,
    differentiable for torch logits), and the rank's partial sums and counts. Summed over the CP
    ranks, loss is the micro-batch's weighted loss: all-reduce it (or, for gradients, backward
    each rank's own loss and sum the replicated parameters' gradients over the CP group).
    """
    cp = _check_cp(cp)
    lib, logits = _lib_of(logits)
    host = _host_list(lib, cu_seqlens, cu_seqlens_host)
    _chunks(host, cp)
    local = [v // cp for v in host]
    cu_local = lib.tensor(local, "int32", logits)
    loss_tok, sums, counts = packed_cross_entropy(
        logits, labels, cu_local, ignore_index, cu_seqlens_host=local
    )
    del loss_tok
    if loss_weights is None:
        loss = sums.sum()
    else:
        weights = lib.tensor([float(w) for w in loss_weights], None, sums)
        if tuple(weights.shape) != tuple(sums.shape):
            raise ValueError(
                f"loss_weights must hold B = {len(host) - 1} weights, got {len(loss_weights)}"
            )
        loss = (sums * weights).sum()
    return loss, sums, counts


def mrope_position_ids(
    token_types,
    cu_seqlens,
    grid_thw,
    grids_per_sequence,
    spatial_merge_size=2,
    cu_seqlens_host=None,
    *,
    total=None,
):
    """3-D rotary position ids (Qwen2-VL's mrope; the rule of Hugging Face transformers'
    ``get_rope_index``) of a packed micro-batch, restarting at 0 in every sequence.

    token_types: int [rows], 0 = text, nonzero = a vision (image or video) token; cu_seqlens: the
    micro-batch's int32 offsets (pad slots of an aligned layout must be typed 0: they continue as
    text); grid_thw: int [N, 3], the (t, h, w) patch grid of every image or video in order of
    appearance over the micro-batch; grids_per_sequence: B ints, how many of them each sequence
    holds (host metadata, so no sync); spatial_merge_size: Qwen2-VL's 2 (a grid covers
    t * (h / m) * (w / m) tokens); total: rows with a tail (text positions restarting at 0).

    Returns (position_ids int64 [3, rows], cu_seqlens int32 [B + 1]): the sequence boundaries are
    the offsets, never inferred from the positions (varlen attention takes cu_seqlens). A
    text-only sequence gets 0, 1, 2, ... on all three rows. ValueError when the token types and
    the grids disagree (CPU; CUDA writes -1 from that token on).
    """
    lib, token_types = _lib_of(token_types)
    types = lib.contiguous(token_types)
    if types.dtype != lib.dtype("int32", types):
        types = lib.contiguous(
            types.astype(lib.np.int32) if not isinstance(lib, _Torch) else types.to(lib.torch.int32)
        )
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    counts = [int(n) for n in grids_per_sequence]
    if len(counts) != len(host) - 1:
        raise ValueError(
            f"grids_per_sequence must hold B = {len(host) - 1} counts, got {len(counts)}"
        )
    grid_host = [0]
    for n in counts:
        if n < 0:
            raise ValueError(f"grids_per_sequence must be >= 0, got {n}")
        grid_host.append(grid_host[-1] + n)
    if isinstance(grid_thw, (list, tuple)):
        grid_thw = lib.tensor([[int(v) for v in g] for g in grid_thw], "int32", types)
    grids = _same_lib(lib, grid_thw)
    if grids.dtype != lib.dtype("int32", grids):
        grids = lib.contiguous(
            grids.astype(lib.np.int32) if not isinstance(lib, _Torch) else grids.to(lib.torch.int32)
        )
    if tuple(grids.shape) == (0,):
        grids = grids.reshape(0, 3)
    grid_cu = lib.tensor(grid_host, "int32", types)
    rows = _rows(total, host[-1])
    out = lib.empty((3, rows), "int64", types)
    _kernels.mrope_position_ids(
        types,
        cu_seqlens,
        host,
        rows,
        grids,
        grid_cu,
        grid_host,
        int(spatial_merge_size),
        out,
        lib.stream(types),
    )
    return out, cu_seqlens
