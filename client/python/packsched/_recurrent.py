"""The recurrent kernels of hybrid models (docs/design.md "Hybrid layers"): the short causal
depthwise convolution, the gated delta rule (Gated DeltaNet) and the Mamba-2 selective scan over
packed and tree-packed rows, each a torch.autograd.Function over the C++ kernels
(packsched/kernels/recurrent.h; float32 or float64; CPU tensors, and CUDA tensors where the
experimental CUDA backend is built). The layout is one int32 array,
``prev_row`` [T]: the row whose state row t continues, -1 for zero state (``flat_prev_rows`` from
cu_seqlens, ``tree_prev_rows`` from the nodes' row ranges and parents)."""

import numpy as np


def flat_prev_rows(cu_seqlens, total=None):
    """prev_row for flat packing: t - 1 inside a sequence, -1 at each sequence start. Rows past
    cu_seqlens[-1] (up to ``total``) are one more sequence (the tail)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    rows = int(cu[-1]) if total is None else int(total)
    if rows < cu[-1]:
        raise ValueError(f"total = {rows} is below cu_seqlens[-1] = {int(cu[-1])}")
    prev = np.arange(-1, rows - 1, dtype=np.int32)
    prev[cu[cu < rows]] = -1
    return prev


def tree_prev_rows(node_begin, node_end, node_parent, rows):
    """prev_row for tree packing from each node's packed rows [node_begin, node_end) and its
    parent node (-1 for a root; any index order, parents' rows before their children's): t - 1
    inside a node, the parent's last row at a node's first row, -1 at a root and on rows no node
    covers (padding, the tail). ValueError naming the node for overlapping or out-of-order rows."""
    begin = np.asarray(node_begin, dtype=np.int64)
    end = np.asarray(node_end, dtype=np.int64)
    parent = np.asarray(node_parent, dtype=np.int64)
    if not (len(begin) == len(end) == len(parent)):
        raise ValueError("node_begin, node_end and node_parent must have one entry per node")
    prev = np.full(int(rows), -1, dtype=np.int32)
    covered = np.zeros(int(rows), dtype=bool)
    for n in range(len(begin)):
        b, e, p = int(begin[n]), int(end[n]), int(parent[n])
        if not 0 <= b < e <= rows:
            raise ValueError(f"node {n}: rows [{b}, {e}) are empty or outside [0, {rows})")
        if covered[b:e].any():
            raise ValueError(f"node {n}: rows [{b}, {e}) overlap another node's")
        covered[b:e] = True
        prev[b + 1 : e] = np.arange(b, e - 1, dtype=np.int32)
        if p >= 0:
            if not 0 <= p < len(begin) or end[p] > b:
                raise ValueError(f"node {n}: parent {p} is not a node whose rows end before {b}")
            prev[b] = end[p] - 1
    return prev


def micro_batch_prev_rows(micro_batch, forest):
    """prev_row over a tree plan's micro-batch (``TreeMicroBatch``, its ``meta.total`` rows):
    its entries as nodes, their rows from ``row`` and the forest's node lengths, their parents
    from ``parent``."""
    begin = np.asarray(micro_batch.row, dtype=np.int64)
    end = begin + np.asarray(forest.node_len, dtype=np.int64)[micro_batch.nodes]
    return tree_prev_rows(begin, end, micro_batch.parent, micro_batch.meta.total)


def states_alive(prev_row):
    """The peak number of branch-point states kept alive at once when the rows run in order: a
    row r is held from its end until the last row t > r + 1 with prev_row[t] = r has started
    (what the CPU forward keeps besides the running state)."""
    prev = np.asarray(prev_row, dtype=np.int64)
    rows = np.arange(len(prev))
    jumps = (prev >= 0) & (prev != rows - 1)
    if not jumps.any():
        return 0
    last = np.full(len(prev), -1, dtype=np.int64)
    np.maximum.at(last, prev[jumps], rows[jumps])
    held = np.flatnonzero(last >= 0)
    delta = np.zeros(len(prev) + 1, dtype=np.int64)
    np.add.at(delta, held + 1, 1)
    np.add.at(delta, last[held] + 1, -1)
    return int(np.cumsum(delta).max())


def causal_conv1d(x, weight, bias, prev_row, silu=True):
    """The short causal depthwise convolution over packed rows: out[t] = act(bias + sum_i
    weight[:, W-1-i] * x[r_i]) over row t's history r_0 = t, r_{i+1} = prev_row[r_i] (zero once
    it ends), act = SiLU or identity. x [T, C], weight [C, W] (transformers' [C, 1, W] squeezed),
    bias [C] or None: torch tensors, float32 or float64. Differentiable in x, weight, bias."""
    from ._ops_recurrent import causal_conv1d as f

    return f(x, weight, bias, prev_row, silu)


def gated_delta_rule(q, k, v, g, beta, prev_row):
    """The gated delta rule per head: S_t = a_t S_in + k_t (beta_t (v_t - a_t S_inᵀ k_t))ᵀ,
    a_t = exp(g_t), S_in = S at prev_row[t] (0 for -1), out_t = S_tᵀ q_t. q, k [T, H, K] as the
    layer gives them (L2-normalised, q scaled), v [T, H, V], g and beta [T, H]; beta None gives
    the gated linear recurrence S_t = a_t S_in + k_t v_tᵀ. Differentiable in every tensor."""
    from ._ops_recurrent import gated_recurrence as f

    return f(q, k, v, g, beta, prev_row)


def selective_scan(x, dt, A, B, C, D, prev_row):
    """The Mamba-2 selective scan (scalar decay per head): h_t = exp(dt_t A) h_in + dt_t B_t x_tᵀ,
    y_t = C_tᵀ h_t + D x_t with h_in = h at prev_row[t]. x [T, H, P], dt [T, H] (after softplus),
    A [H], B and C [T, G, N] (head h reads group h // (H / G)), D [H] or None. The gated
    recurrence with q = C, k = B, v = dt x, g = dt A. Differentiable in every tensor."""
    heads, groups = x.shape[1], B.shape[1]
    if heads % groups:
        raise ValueError(f"x has {heads} heads, not a multiple of B's {groups} groups")
    rep = heads // groups
    Bh = B.repeat_interleave(rep, dim=1) if rep > 1 else B
    Ch = C.repeat_interleave(rep, dim=1) if rep > 1 else C
    y = gated_delta_rule(Ch, Bh, x * dt.unsqueeze(-1), dt * A, None, prev_row)
    if D is not None:
        y = y + x * D.view(1, -1, 1)
    return y
