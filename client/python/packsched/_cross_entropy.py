"""Packed cross entropy of packsched.kernels and its gradient (computed in blocks of rows). Torch
tensors go through the custom ops of packsched._ops_loss, whose implementations are
_cross_entropy and _cross_entropy_backward here."""

from . import _kernels
from ._arrays import _Torch, _host, _lib_of, _rows, _same_lib, _torch_ops


def packed_cross_entropy(
    logits, labels, cu_seqlens, ignore_index=-100, cu_seqlens_host=None, *, total=None
):
    """Cross entropy over packed logits with already-shifted labels (shift_labels' output).

    logits: [rows, V] float16, bfloat16, float32 or float64; labels: int32/int64 [rows],
    ignore_index or in [0, V); cu_seqlens: int32 [B+1] over the rows (real or padded offsets);
    total: rows = total with a tail past cu_seqlens[-1] (loss 0 and zero gradient there, labels
    not read).
    Returns (per_token_loss [rows], per_sequence_sum [B], per_sequence_count int64 [B]): loss in
    nats, -log softmax(logits[t])[labels[t]], 0 where ignored; losses and sums in logits' dtype
    (16-bit inputs accumulate in float32, float64 in float64); counts of non-ignored tokens.
    For torch logits (the custom op packsched::packed_cross_entropy) that require grad, the
    losses and sums are differentiable with respect to the logits (d loss_t / d logits[t] =
    softmax(logits[t]) - onehot(labels[t]), 0 where ignored).
    """
    lib, logits = _lib_of(logits)
    if isinstance(lib, _Torch):
        return _torch_ops().packed_cross_entropy(
            logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, total
        )
    return _cross_entropy(lib, logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, total)


def _cross_entropy(lib, logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, total):
    labels = _same_lib(lib, labels)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    logits = lib.contiguous(logits)
    batch = len(host) - 1
    rows = _rows(total, host[-1])
    loss = lib.empty((rows,), None, logits)
    sums = lib.empty((batch,), None, logits)
    counts = lib.empty((batch,), "int64", logits)
    _kernels.packed_cross_entropy(
        logits,
        labels,
        cu_seqlens,
        host,
        rows,
        int(ignore_index),
        loss,
        sums,
        counts,
        lib.stream(logits),
    )
    return loss, sums, counts


def _cross_entropy_backward(
    lib, logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, d_loss, d_sums
):
    """d(sum_t d_loss[t] * loss_t + sum_b d_sums[b] * sums_b) / d logits (torch tensors, lib the
    torch adapter), logits' dtype and strides."""
    torch = lib.torch
    host = _host(lib, _same_lib(lib, cu_seqlens), cu_seqlens_host)
    # Each row's loss feeds its own entry and its sequence's sum; tail rows (past host[-1])
    # belong to no sequence and have no gradient.
    lengths = torch.tensor(
        [b - a for a, b in zip(host, host[1:])], dtype=torch.long, device=logits.device
    )
    seq_of_row = torch.repeat_interleave(torch.arange(len(lengths), device=logits.device), lengths)
    grad_row = d_loss.clone()
    grad_row[: host[-1]] += d_sums[seq_of_row]
    grad_row[host[-1] :] = 0
    return _cross_entropy_grad(torch, logits, _same_lib(lib, labels), grad_row, int(ignore_index))


# Rows of the cross-entropy gradient are computed this many float32 logits at a time, so the
# backward's peak is the gradient itself plus one such block (not two [rows, V] float32 arrays).
_CE_GRAD_BLOCK_ELEMENTS = 1 << 22


def _cross_entropy_grad(torch, logits, labels, grad_row, ignore_index):
    """d(sum_t grad_row[t] * loss_t) / d logits in logits' dtype: per row
    grad_row[t] * (softmax(logits[t]) - onehot(labels[t])), 0 where labels[t] == ignore_index
    (tail rows come with grad_row 0; their labels, unread by the kernel, may be anything).
    Computed in float32 (float64 for float64 logits) one block of rows at a time; every row's
    arithmetic is the same as for the whole array at once."""
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    rows, vocab = logits.shape
    grad = torch.empty_like(logits)
    block = max(1, _CE_GRAD_BLOCK_ELEMENTS // max(1, vocab))
    for start in range(0, rows, block):
        stop = min(rows, start + block)
        g = torch.softmax(logits[start:stop].to(compute), dim=-1)
        lab = labels[start:stop]
        valid = (lab != ignore_index) & (grad_row[start:stop] != 0)
        hit = torch.nonzero(valid).squeeze(1)
        g[hit, lab[hit].long()] -= 1.0  # d(-log p_y)/d logits = p - onehot(y)
        g[~valid] = 0.0
        g.mul_(grad_row[start:stop].to(compute)[:, None])
        grad[start:stop] = g
        del g  # before the next block's softmax allocates its own
    return grad
