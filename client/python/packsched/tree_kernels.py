"""Kernels of tree packing: attention under the tree mask, depths, the loss over targets where one
row predicts several next tokens, and the restore of per-rollout outputs. Re-exported by
packsched.kernels (tree_attention, tree_position_ids, multi_target_cross_entropy); see
docs/design.md, "Tree packing", for the layout and the rules.

Layout of one micro-batch (what the plan gives): pieces one after another (``cu_seqlens``), each a
tree (or part of one) with its nodes in depth-first preorder; per packed row t its depth
``positions[t]`` and ``subtree_end[t]``, one past the last row of the subtree of t's node; per
rollout r the rows of its tokens in path order, ``rollout_rows[r]``.

Mask rule: query row i sees key row j (same piece) iff j <= i < subtree_end[j] (and, with a left
window w, positions[i] - positions[j] <= w): exactly each rollout run on its own, causally.

Loss rule: rollout r with tokens x_0..x_{L-1} at rows rows[r] adds, for p < L - 1,
w_r(p) * CE(logits[rows[r][p]], x_{p+1}); tree_targets turns that into (row, label, weight)
targets with identical (row, label) pairs merged (summed weights), so a node's last row carries
one target per distinct next token of its children.

Context parallelism (packsched._tree_cp): tree_cp_rows gives a CP rank's row map (the tree shard
map, balanced by the work under the mask; segment_rows' head-tail map on a flat segment),
tree_cp_shard / tree_cp_unshard move rows, tree_cp_attention runs the shard's queries against the
gathered keys (computing only those rows: the kernels' query-row map), tree_cp_targets
and tree_cp_cross_entropy give the shard's loss.
"""

import numpy as np

from . import _kernels
from ._arrays import _Torch, _host, _is_float64, _lib_of, _rows, _same_lib, _torch_ops
from ._attention import _AttentionLayout, _forward
from ._tree_cp import (
    tree_cp_attention,
    tree_cp_cross_entropy,
    tree_cp_rows,
    tree_cp_shard,
    tree_cp_targets,
    tree_cp_unshard,
    tree_cp_work,
    tree_segment_rows,
)

__all__ = [
    "tree_attention",
    "tree_position_ids",
    "multi_target_cross_entropy",
    "tree_targets",
    "TreeTargets",
    "restore",
    "tree_mrope_position_ids",
    "tree_segment_rows",
    "tree_cp_rows",
    "tree_cp_shard",
    "tree_cp_unshard",
    "tree_cp_attention",
    "tree_cp_targets",
    "tree_cp_cross_entropy",
    "tree_cp_work",
]


class _TreeLayout(_AttentionLayout):
    """An attention layout (self-attention, causal) with its tree arrays."""

    def __init__(self, lib, like, params):
        """params: tree_attention's arguments by name."""
        cu, host, seqused, total = (
            params[name] for name in ("cu_seqlens", "cu_seqlens_host", "seqused", "total")
        )
        super().__init__(
            lib,
            like,
            cu,
            cu,
            params["max_seqlen"],
            params["max_seqlen"],
            params["softmax_scale"],
            True,
            (params["window_left"], -1),
            params["softcap"],
            seqused,
            seqused,
            host,
            host,
            total,
            total,
        )
        self.subtree_end = _same_lib(lib, params["subtree_end"])
        positions = params["positions"]
        self.positions = None if positions is None else _same_lib(lib, positions)
        # The query-row map (host int32, on either backend; tree_cp_attention passes it).
        self.query_rows = params.get("query_rows")

    def args(self):
        return dict(
            super().args(),
            subtree_end=self.subtree_end,
            positions=self.positions,
            query_rows=self.query_rows,
        )


def tree_attention(
    q,
    k,
    v,
    cu_seqlens,
    max_seqlen,
    subtree_end,
    positions=None,
    *,
    softmax_scale=None,
    window_left=-1,
    softcap=0.0,
    seqused=None,
    cu_seqlens_host=None,
    total=None,
    return_lse=False,
    backend=None,
):
    """Causal self-attention of a tree-packed micro-batch (the mask rule above).

    q: [T, H, D], k and v: [T, Hk, D] (float16, bfloat16, float32; float64 on the CPU), GQA as in
    varlen_attention. cu_seqlens: int32 [B+1] piece offsets; max_seqlen >= the longest piece.
    subtree_end: int32 [T]; positions: int32 [T] depths, required with a left window
    (window_left >= 0, on depths; a window >= max_seqlen is unbounded). softmax_scale, softcap,
    cu_seqlens_host and total (a tail) as in varlen_attention; seqused (int32 [B]) the real
    lengths of an aligned layout's pieces (their pad slots are then never keys and see no key).

    backend (torch tensors): which implementation runs the call, "auto" by default (the
    environment variable PACKSCHED_ATTENTION_BACKEND, else the shipped table); "packsched" or
    "flex" (FlexAttention with a block mask of this layout) forces one, ValueError if it cannot
    run the call; varlen_attn and flash_attn take no tree mask.

    Returns out [T, H, D] (and lse [H, T] with return_lse). For torch tensors by default the op
    packsched::tree_attention_forward (gradients to q, k, v through
    packsched::tree_attention_backward; traced by torch.compile); other inputs run the forward
    only. Invalid arguments raise ValueError naming the argument.
    """
    lib, q = _lib_of(q)
    if isinstance(lib, _Torch):
        # Spelled out, not locals(): dynamo before torch 2.5 cannot trace locals().
        params = dict(
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            subtree_end=subtree_end,
            positions=positions,
            softmax_scale=softmax_scale,
            window_left=window_left,
            softcap=softcap,
            seqused=seqused,
            cu_seqlens_host=cu_seqlens_host,
            total=total,
        )
        from . import _attention_dispatch

        out, lse = _attention_dispatch.tree(q, k, v, params, backend, bool(return_lse))
    else:
        out, lse = _forward(lib, q, k, v, _TreeLayout(lib, q, locals()))
    return (out, lse) if return_lse else out


def tree_position_ids(cu_seqlens, subtree_end, total=None, cu_seqlens_host=None):
    """Each row's depth (int64 [rows]): the rows of its piece before it whose subtree it is in.
    For a flat sequence this is position_ids. Tail rows (``total``) count from 0."""
    lib, cu_seqlens = _lib_of(cu_seqlens)
    if isinstance(lib, _Torch):
        return _torch_ops().tree_position_ids(cu_seqlens, subtree_end, total, cu_seqlens_host)
    return _tree_position_ids(lib, cu_seqlens, subtree_end, total, cu_seqlens_host)


def _tree_position_ids(lib, cu_seqlens, subtree_end, total, cu_seqlens_host):
    subtree_end = _same_lib(lib, subtree_end)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    rows = _rows(total, host[-1])
    out = lib.empty((rows,), "int64", subtree_end)
    _kernels.tree_position_ids(cu_seqlens, host, rows, subtree_end, out, lib.stream(subtree_end))
    return out


def _ce_forward(lib, logits, rows, labels):
    logits = lib.contiguous(logits)
    acc = "float64" if _is_float64(lib, logits) else "float32"
    loss = lib.empty((rows.shape[0],), acc, logits)
    row_lse = lib.empty((logits.shape[0],), acc, logits)
    _kernels.multi_target_cross_entropy(logits, rows, labels, loss, row_lse, lib.stream(logits))
    return loss, row_lse


def _ce_backward(lib, logits, row_lse, rows, labels, d_loss):
    """d(sum_i d_loss[i] * loss_i) / d logits (logits' dtype and shape), for torch tensors: the
    forward's row_lse, d_loss in any floating dtype."""
    logits = lib.contiguous(logits)
    d_logits = lib.empty(tuple(logits.shape), None, logits)
    _kernels.multi_target_cross_entropy_backward(
        logits,
        lib.contiguous(row_lse),
        _same_lib(lib, rows),
        _same_lib(lib, labels),
        lib.contiguous(d_loss.to(row_lse.dtype)),
        d_logits,
        lib.stream(logits),
    )
    return d_logits


def multi_target_cross_entropy(logits, rows, labels):
    """Cross entropy of each target (rows[i], labels[i]): logsumexp(logits[rows[i]]) -
    logits[rows[i], labels[i]], float32 [T] (float64 for float64 logits).

    logits: [R, V]; rows, labels: int32 or int64 [T] (one dtype), rows non-decreasing (as
    tree_targets gives them), any number of targets per row. For torch logits that require grad
    the result is differentiable (d loss_i / d logits[rows[i]] = softmax - onehot(labels[i])).
    Weight and sum it yourself: (weights * loss).sum(). Torch tensors: the custom op
    packsched::multi_target_cross_entropy (backward packsched::multi_target_cross_entropy_backward).
    """
    lib, logits = _lib_of(logits)
    if isinstance(lib, _Torch):
        return _torch_ops().multi_target_cross_entropy(logits, rows, labels)
    return _ce_forward(lib, logits, _same_lib(lib, rows), _same_lib(lib, labels))[0]


class TreeTargets:
    """Targets of one micro-batch (numpy): ``rows``, ``labels`` (int64 [T], sorted by row then
    label, (row, label) pairs distinct), ``weights`` (float64 [T], summed over the rollouts that
    share a pair), and ``index``: per rollout r an int64 [L_r - 1] array, the target of its
    position p (row rows[r][p] predicting token p + 1), for restoring per-rollout values."""

    def __init__(self, rows, labels, weights, index):
        self.rows, self.labels, self.weights, self.index = rows, labels, weights, index


def tree_targets(rollout_rows, rollout_tokens, rollout_weights, loss_masks=None):
    """Builds the targets of a micro-batch from its layout and its rollouts (the loss rule above).

    rollout_rows[r]: the packed rows of rollout r's tokens (int [L_r]); rollout_tokens[r]: its
    token ids (int [L_r]); rollout_weights[r]: its weight (a number: the plan's loss weight, any
    loss mode) or per-position weights (float [L_r - 1], the weight of predicting token p + 1);
    loss_masks[r] (optional, bool [L_r]): token t is trained iff loss_masks[r][t], so position p
    weighs rollout_weights[r] * loss_masks[r][p + 1]. Every position of every rollout gets a
    target (weight 0 where it is not trained), so ``index`` restores every log-probability. A
    shared row counts once per rollout through it, each with that rollout's weight; a row whose
    rollouts continue with different tokens gets one target per distinct token.
    """
    n = len(rollout_rows)
    if len(rollout_tokens) != n or len(rollout_weights) != n:
        raise ValueError(
            f"rollout_rows, rollout_tokens and rollout_weights must have one entry per rollout, "
            f"got {n}, {len(rollout_tokens)} and {len(rollout_weights)}"
        )
    rows, labels, weights, sizes = [], [], [], []
    for r in range(n):
        rr = np.asarray(rollout_rows[r], dtype=np.int64)
        tok = np.asarray(rollout_tokens[r], dtype=np.int64)
        if rr.shape != tok.shape or rr.ndim != 1:
            raise ValueError(
                f"rollout {r}: rows {list(rr.shape)} and tokens {list(tok.shape)} must be the same "
                f"1-D length"
            )
        w = np.broadcast_to(
            np.asarray(rollout_weights[r], dtype=np.float64), (max(0, len(rr) - 1),)
        )
        if loss_masks is not None:
            m = np.asarray(loss_masks[r], dtype=bool)
            if m.shape != rr.shape:
                raise ValueError(f"rollout {r}: loss mask {list(m.shape)} must match its tokens")
            w = w * m[1:]
        rows.append(rr[:-1])
        labels.append(tok[1:])
        weights.append(w)
        sizes.append(max(0, len(rr) - 1))
    rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    labels = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    weights = np.concatenate(weights) if weights else np.zeros(0, np.float64)
    pairs, inverse = np.unique(np.stack([rows, labels], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    summed = np.zeros(len(pairs), dtype=np.float64)
    np.add.at(summed, inverse, weights)
    index = np.split(inverse.astype(np.int64), np.cumsum(sizes)[:-1]) if n else []
    return TreeTargets(
        np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1]), summed, index
    )


def restore(values, rollout_index):
    """Per-rollout outputs in each rollout's own order: [values[i] for i in rollout_index], where
    rollout_index[r] is rollout r's rows (per-row values such as entropies) or its targets' index
    (TreeTargets.index, per-target values such as the log-probabilities -loss). ``values``: a
    torch tensor or numpy array indexed on its first dimension."""
    lib, values = _lib_of(values)
    out = []
    for idx in rollout_index:
        if isinstance(lib, _Torch):
            out.append(values[lib.torch.as_tensor(np.asarray(idx), device=values.device)])
        else:
            out.append(values[np.asarray(idx, dtype=np.int64)])
    return out


def tree_mrope_position_ids(
    rollout_rows, rollout_token_types, grid_thw, grids_per_rollout, rows, spatial_merge_size=2
):
    """3-D rotary position ids (mrope_position_ids' rule) of a tree-packed micro-batch: the same
    rule as depths, each row's positions are those it has in every rollout through it.

    rollout_rows[r]: rollout r's packed rows (int [L_r]); rollout_token_types[r]: its token types
    (int [L_r], 0 = text); grid_thw: int [N, 3], the grids of every rollout in order (rollout 0's
    first); grids_per_rollout: how many each holds; rows: the micro-batch's rows. Computes
    mrope_position_ids over the rollouts laid out one after another (each its own sequence) and
    scatters them to the packed rows. Returns int64 numpy [3, rows]; rows on no rollout's path
    are 0. ValueError when two rollouts through a row disagree on it (their shared prefix is not
    the same tokens and grids).
    """
    from ._context_parallel import mrope_position_ids

    lens = [len(r) for r in rollout_rows]
    types = np.concatenate([np.asarray(t, dtype=np.int32) for t in rollout_token_types])
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    flat, _ = mrope_position_ids(
        types,
        cu,
        np.asarray(grid_thw, dtype=np.int32).reshape(-1, 3),
        grids_per_rollout,
        spatial_merge_size,
    )
    flat = np.asarray(flat)
    out = np.zeros((3, rows), dtype=np.int64)
    seen = np.zeros(rows, dtype=bool)
    index = np.concatenate([np.asarray(r, dtype=np.int64) for r in rollout_rows])
    for u, row in enumerate(index):
        if seen[row] and not np.array_equal(out[:, row], flat[:, u]):
            raise ValueError(
                f"row {row}: rollouts through it disagree on its 3-D position "
                f"({out[:, row].tolist()} against {flat[:, u].tolist()})"
            )
        out[:, row] = flat[:, u]
        seen[row] = True
    return out
