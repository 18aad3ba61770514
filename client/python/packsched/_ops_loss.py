"""The losses as torch custom ops (packsched::packed_cross_entropy and
packsched::multi_target_cross_entropy, each with its _backward op), their autograd, and the torch
path of the public functions.

packed_cross_entropy returns (loss [rows] and sums [B] in logits' dtype, counts int64 [B]), rows
= logits.shape[0] and B = cu_seqlens.shape[0] - 1, so the fake needs no offsets; the host offsets
are optional (the implementation reads the tensor without them). multi_target_cross_entropy
returns (loss [T], row_lse [R]), float32 (float64 for float64 logits); the public function gives
the loss alone. Both are differentiable in the logits only (counts and row_lse are not).
"""

from typing import List, Optional

import torch

from . import _cross_entropy, tree_kernels
from ._torch_args import TORCH, acc_dtype, check_dtypes, differentiable, host, integer
from ._torch_args import optional_index, plain, tensor

Tensor = torch.Tensor


@torch.library.custom_op("packsched::packed_cross_entropy", mutates_args=())
def _packed_cross_entropy(
    logits: Tensor,
    labels: Tensor,
    cu_seqlens: Tensor,
    ignore_index: int,
    cu_seqlens_host: Optional[List[int]],
    total: Optional[int],
) -> tuple[Tensor, Tensor, Tensor]:
    _check_ce(logits, labels, cu_seqlens)
    return _cross_entropy._cross_entropy(
        TORCH, logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, total
    )


def _check_ce(logits, labels, cu_seqlens, **grads):
    check_dtypes(
        "PackedCrossEntropy",
        floats=("logits",),
        logits=logits,
        labels=labels,
        cu_seqlens=cu_seqlens,
        **grads,
    )


@_packed_cross_entropy.register_fake
def _(logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, total):
    _check_ce(logits, labels, cu_seqlens)
    batch = cu_seqlens.shape[0] - 1
    return (
        logits.new_empty((logits.shape[0],)),
        logits.new_empty((batch,)),
        logits.new_empty((batch,), dtype=torch.int64),
    )


@torch.library.custom_op("packsched::packed_cross_entropy_backward", mutates_args=())
def _packed_cross_entropy_backward(
    logits: Tensor,
    labels: Tensor,
    cu_seqlens: Tensor,
    ignore_index: int,
    cu_seqlens_host: Optional[List[int]],
    d_loss: Tensor,
    d_sums: Tensor,
) -> Tensor:
    _check_ce(logits, labels, cu_seqlens, d_loss=d_loss, d_sums=d_sums)
    return _cross_entropy._cross_entropy_backward(
        TORCH, logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, d_loss, d_sums
    )


@_packed_cross_entropy_backward.register_fake
def _(logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, d_loss, d_sums):
    _check_ce(logits, labels, cu_seqlens, d_loss=d_loss, d_sums=d_sums)
    return torch.empty_like(logits)


def _ce_setup(ctx, inputs, output):
    logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, _total = inputs
    ctx.mark_non_differentiable(output[2])
    ctx.save_for_backward(logits, labels, cu_seqlens)
    ctx.ignore_index, ctx.cu_seqlens_host = ignore_index, cu_seqlens_host


def _ce_grad(ctx, d_loss, d_sums, _d_counts):
    logits, labels, cu_seqlens = ctx.saved_tensors
    d_logits = _packed_cross_entropy_backward(
        logits, labels, cu_seqlens, ctx.ignore_index, ctx.cu_seqlens_host, d_loss, d_sums
    )
    return d_logits, None, None, None, None, None


_packed_cross_entropy_call = differentiable(_packed_cross_entropy, _ce_grad, _ce_setup)


def packed_cross_entropy(logits, labels, cu_seqlens, ignore_index, cu_seqlens_host, total):
    labels, cu_seqlens = plain(labels), plain(cu_seqlens)
    return _packed_cross_entropy_call(
        tensor(logits),
        labels,
        cu_seqlens,
        integer(ignore_index),
        host(cu_seqlens, cu_seqlens_host),
        optional_index(total, "total"),
    )


@torch.library.custom_op("packsched::multi_target_cross_entropy", mutates_args=())
def _multi_target(logits: Tensor, rows: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    _check_multi_target("MultiTargetCrossEntropy", logits, rows, labels)
    rows, labels = TORCH.contiguous(rows), TORCH.contiguous(labels)
    return tree_kernels._ce_forward(TORCH, logits, rows, labels)


def _check_multi_target(op, logits, rows, labels, **more):
    check_dtypes(op, floats=("logits",), logits=logits, rows=rows, labels=labels, **more)


@_multi_target.register_fake
def _(logits, rows, labels):
    _check_multi_target("MultiTargetCrossEntropy", logits, rows, labels)
    acc = acc_dtype(logits)
    return logits.new_empty((rows.shape[0],), dtype=acc), logits.new_empty(
        (logits.shape[0],), dtype=acc
    )


@torch.library.custom_op("packsched::multi_target_cross_entropy_backward", mutates_args=())
def _multi_target_backward(
    logits: Tensor, row_lse: Tensor, rows: Tensor, labels: Tensor, d_loss: Tensor
) -> Tensor:
    op = "MultiTargetCrossEntropyBackward"
    _check_multi_target(op, logits, rows, labels, row_lse=row_lse, d_loss=d_loss)
    return tree_kernels._ce_backward(TORCH, logits, row_lse, rows, labels, d_loss)


@_multi_target_backward.register_fake
def _(logits, row_lse, rows, labels, d_loss):
    op = "MultiTargetCrossEntropyBackward"
    _check_multi_target(op, logits, rows, labels, row_lse=row_lse, d_loss=d_loss)
    return logits.new_empty(tuple(logits.shape))


def _multi_target_setup(ctx, inputs, output):
    logits, rows, labels = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(logits, output[1], rows, labels)


def _multi_target_grad(ctx, d_loss, _d_row_lse):
    logits, row_lse, rows, labels = ctx.saved_tensors
    return _multi_target_backward(logits, row_lse, rows, labels, d_loss), None, None


_multi_target_call = differentiable(_multi_target, _multi_target_grad, _multi_target_setup)


def multi_target_cross_entropy(logits, rows, labels):
    return _multi_target_call(tensor(logits), plain(rows), plain(labels))[0]
