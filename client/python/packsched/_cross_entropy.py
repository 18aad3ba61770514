"""Packed cross entropy of packsched.kernels, and its torch autograd function (the gradient
computed in blocks of rows)."""

from . import _kernels
from ._arrays import _LIBS, _Torch, _host, _lib_of, _rows, _same_lib


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
    For torch logits that require grad, the losses and sums are differentiable with respect to
    the logits (d loss_t / d logits[t] = softmax(logits[t]) - onehot(labels[t]), 0 where ignored).
    """
    lib, logits_in = _lib_of(logits)
    labels = _same_lib(lib, labels)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    if isinstance(lib, _Torch) and logits_in.requires_grad:
        return _cross_entropy_function().apply(
            logits_in, labels, cu_seqlens, host, int(ignore_index), total
        )
    return _cross_entropy(lib, logits_in, labels, cu_seqlens, host, int(ignore_index), total)


def _cross_entropy(lib, logits, labels, cu_seqlens, host, ignore_index, total):
    logits = lib.contiguous(logits)
    batch = len(host) - 1
    rows = _rows(total, host[-1])
    loss = lib.empty((rows,), None, logits)
    sums = lib.empty((batch,), None, logits)
    counts = lib.empty((batch,), "int64", logits)
    _kernels.packed_cross_entropy(
        logits, labels, cu_seqlens, host, rows, ignore_index, loss, sums, counts, lib.stream(logits)
    )
    return loss, sums, counts


_CROSS_ENTROPY = None


def _cross_entropy_function():
    global _CROSS_ENTROPY
    if _CROSS_ENTROPY is None:
        import torch

        class PackedCrossEntropy(torch.autograd.Function):
            @staticmethod
            def forward(ctx, logits, labels, cu_seqlens, host, ignore_index, total):
                loss, sums, counts = _cross_entropy(
                    _LIBS["torch"], logits, labels, cu_seqlens, host, ignore_index, total
                )
                ctx.save_for_backward(logits, labels)
                ctx.host, ctx.ignore_index = host, ignore_index
                ctx.mark_non_differentiable(counts)
                return loss, sums, counts

            @staticmethod
            def backward(ctx, d_loss, d_sums, _d_counts):
                logits, labels = ctx.saved_tensors
                # Each row's loss feeds its own entry and its sequence's sum; tail rows (past
                # host[-1]) belong to no sequence and have no gradient.
                lengths = torch.tensor(
                    [b - a for a, b in zip(ctx.host, ctx.host[1:])],
                    dtype=torch.long,
                    device=logits.device,
                )
                seq_of_row = torch.repeat_interleave(
                    torch.arange(len(lengths), device=logits.device), lengths
                )
                grad_row = d_loss.clone()
                grad_row[: ctx.host[-1]] += d_sums[seq_of_row]
                grad_row[ctx.host[-1] :] = 0
                return (
                    _cross_entropy_grad(torch, logits, labels, grad_row, ctx.ignore_index),
                    None,
                    None,
                    None,
                    None,
                    None,
                )

        _CROSS_ENTROPY = PackedCrossEntropy
    return _CROSS_ENTROPY


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
