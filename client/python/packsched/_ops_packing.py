"""The packing kernels as torch custom ops (packsched::unpad, pad, pack_aligned, unpack_aligned,
position_ids, shift_labels, tree_position_ids), and the torch path of their public functions.

None has a gradient: the public functions detach their inputs, as the direct path always did.
Each op's implementation is the direct path's ``_name(lib, ...)`` with lib = torch; each fake
gives the output shapes from the input shapes and the host offsets. Where an output's length is
the last offset (unpad, unpack_aligned; position_ids and tree_position_ids without ``total``;
pack_aligned's padded total), the op takes the host offsets and the public function reads them
from the tensor when the caller gave none: one device-to-host copy, and under torch.compile a
graph break at that read, before the op (see packsched._torch_ops on why not unbacked sizes).
"""

from typing import List, Optional

import torch

from . import _packing, tree_kernels
from ._torch_args import TORCH, check_dtypes, host, integer, optional_index, plain

Tensor = torch.Tensor


def _last_offset(host_values, op):
    """The output length of a fake that the host offsets give (ValueError without them)."""
    if not host_values:
        raise ValueError(
            f"packsched::{op}: the output length is the last host offset: pass cu_seqlens_host "
            "(or total where the op takes one)"
        )
    return host_values[-1]


def _known_host(cu, cu_host, name="cu_seqlens"):
    """The caller's host offsets, else read from cu (a sync on a GPU; a graph break if traced)."""
    values = host(cu, cu_host, name)
    return TORCH.to_list(cu) if values is None else values


@torch.library.custom_op("packsched::unpad", mutates_args=())
def _unpad(
    x: Tensor, mask: Tensor, cu_seqlens: Tensor, cu_seqlens_host: List[int]
) -> tuple[Tensor, Tensor]:
    check_dtypes("Unpad", x=x, mask=mask, cu_seqlens=cu_seqlens)
    x_packed, indices, _, _ = _packing._unpad(TORCH, x, mask, cu_seqlens, cu_seqlens_host)
    return x_packed, indices


@_unpad.register_fake
def _(x, mask, cu_seqlens, cu_seqlens_host):
    check_dtypes("Unpad", x=x, mask=mask, cu_seqlens=cu_seqlens)
    total = _last_offset(cu_seqlens_host, "unpad")
    return x.new_empty((total,) + tuple(x.shape[2:])), x.new_empty((total,), dtype=torch.int64)


def unpad(x, mask, cu_seqlens, cu_seqlens_host):
    x, mask = plain(x), plain(mask)
    if cu_seqlens is None:  # counted from the mask on the host, as the direct path does
        cu_seqlens, host_values = _packing._unpad_offsets(TORCH, x, TORCH.mask(mask), None, None)
    else:
        cu_seqlens = plain(cu_seqlens).contiguous()
        host_values = _known_host(cu_seqlens, cu_seqlens_host)
    x_packed, indices = _unpad(x, mask, cu_seqlens, host_values)
    max_seqlen = _packing._max_length(host_values)
    return x_packed, indices, cu_seqlens, max_seqlen, TORCH.diff(cu_seqlens)


@torch.library.custom_op("packsched::pad", mutates_args=())
def _pad(x_packed: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    check_dtypes("Pad", x_packed=x_packed, indices=indices)
    return _packing._pad(TORCH, x_packed, indices, batch, seqlen)


@_pad.register_fake
def _(x_packed, indices, batch, seqlen):
    check_dtypes("Pad", x_packed=x_packed, indices=indices)
    return x_packed.new_empty((batch, seqlen) + tuple(x_packed.shape[1:]))


def pad(x_packed, indices, batch, seqlen):
    return _pad(plain(x_packed), plain(indices), integer(batch), integer(seqlen))


@torch.library.custom_op("packsched::pack_aligned", mutates_args=())
def _pack_aligned(
    x_packed: Tensor,
    cu_seqlens: Tensor,
    cu_seqlens_host: List[int],
    align: int,
    pad_value: float,
    total: Optional[int],
) -> tuple[Tensor, Tensor, Tensor]:
    check_dtypes("PackAligned", x_packed=x_packed, cu_seqlens=cu_seqlens)
    return _packing._pack_aligned(
        TORCH, x_packed, cu_seqlens, align, pad_value, cu_seqlens_host, total
    )


@_pack_aligned.register_fake
def _(x_packed, cu_seqlens, cu_seqlens_host, align, pad_value, total):
    check_dtypes("PackAligned", x_packed=x_packed, cu_seqlens=cu_seqlens)
    if align < 1:  # the C++ check, here so that the padded total below is defined
        raise ValueError(f"AlignedCuSeqlens: align must be in [1, 2^31), got {align}")
    padded = 0
    for a, b in zip(cu_seqlens_host, cu_seqlens_host[1:]):
        padded += (b - a + align - 1) // align * align
    batch = len(cu_seqlens_host) - 1
    return (
        x_packed.new_empty((padded if total is None else total,) + tuple(x_packed.shape[1:])),
        x_packed.new_empty((batch + 1,), dtype=torch.int32),
        x_packed.new_empty((batch,), dtype=torch.int32),
    )


def pack_aligned(x_packed, cu_seqlens, align, pad_value, cu_seqlens_host, total):
    cu_seqlens = plain(cu_seqlens)
    host_values = _known_host(cu_seqlens, cu_seqlens_host)
    total = optional_index(total, "total")
    return _pack_aligned(
        plain(x_packed), cu_seqlens, host_values, integer(align), float(pad_value), total
    )


@torch.library.custom_op("packsched::unpack_aligned", mutates_args=())
def _unpack_aligned(
    x_aligned: Tensor,
    cu_seqlens: Tensor,
    cu_seqlens_padded: Tensor,
    cu_seqlens_host: List[int],
    cu_seqlens_padded_host: Optional[List[int]],
    total: Optional[int],
) -> Tensor:
    check_dtypes(
        "UnpackAligned",
        x_aligned=x_aligned,
        cu_seqlens=cu_seqlens,
        cu_seqlens_padded=cu_seqlens_padded,
    )
    return _packing._unpack_aligned(
        TORCH,
        x_aligned,
        cu_seqlens,
        cu_seqlens_padded,
        cu_seqlens_host,
        cu_seqlens_padded_host,
        total,
    )


@_unpack_aligned.register_fake
def _(x_aligned, cu_seqlens, cu_seqlens_padded, cu_seqlens_host, cu_seqlens_padded_host, total):
    check_dtypes(
        "UnpackAligned",
        x_aligned=x_aligned,
        cu_seqlens=cu_seqlens,
        cu_seqlens_padded=cu_seqlens_padded,
    )
    rows = _last_offset(cu_seqlens_host, "unpack_aligned")
    return x_aligned.new_empty((rows,) + tuple(x_aligned.shape[1:]))


def unpack_aligned(
    x_aligned, cu_seqlens, cu_seqlens_padded, cu_seqlens_host, cu_seqlens_padded_host, total
):
    cu_seqlens = plain(cu_seqlens)
    cu_seqlens_padded = plain(cu_seqlens_padded)
    return _unpack_aligned(
        plain(x_aligned),
        cu_seqlens,
        cu_seqlens_padded,
        _known_host(cu_seqlens, cu_seqlens_host),
        host(cu_seqlens_padded, cu_seqlens_padded_host, "cu_seqlens_padded"),
        optional_index(total, "total"),
    )


@torch.library.custom_op("packsched::position_ids", mutates_args=())
def _position_ids(
    cu_seqlens: Tensor, cu_seqlens_host: Optional[List[int]], total: Optional[int]
) -> Tensor:
    check_dtypes("PositionIds", cu_seqlens=cu_seqlens)
    return _packing._position_ids(TORCH, cu_seqlens, total, cu_seqlens_host)


@_position_ids.register_fake
def _(cu_seqlens, cu_seqlens_host, total):
    check_dtypes("PositionIds", cu_seqlens=cu_seqlens)
    rows = total if total is not None else _last_offset(cu_seqlens_host, "position_ids")
    return cu_seqlens.new_empty((rows,), dtype=torch.int64)


def position_ids(cu_seqlens, total, cu_seqlens_host):
    cu_seqlens = plain(cu_seqlens)
    total = optional_index(total, "total")
    host_values = host(cu_seqlens, cu_seqlens_host)
    if total is None and host_values is None:
        host_values = TORCH.to_list(cu_seqlens)
    return _position_ids(cu_seqlens, host_values, total)


@torch.library.custom_op("packsched::tree_position_ids", mutates_args=())
def _tree_position_ids(
    cu_seqlens: Tensor,
    subtree_end: Tensor,
    cu_seqlens_host: Optional[List[int]],
    total: Optional[int],
) -> Tensor:
    check_dtypes("TreePositionIds", cu_seqlens=cu_seqlens, subtree_end=subtree_end)
    return tree_kernels._tree_position_ids(TORCH, cu_seqlens, subtree_end, total, cu_seqlens_host)


@_tree_position_ids.register_fake
def _(cu_seqlens, subtree_end, cu_seqlens_host, total):
    check_dtypes("TreePositionIds", cu_seqlens=cu_seqlens, subtree_end=subtree_end)
    rows = total if total is not None else _last_offset(cu_seqlens_host, "tree_position_ids")
    return subtree_end.new_empty((rows,), dtype=torch.int64)


def tree_position_ids(cu_seqlens, subtree_end, total, cu_seqlens_host):
    cu_seqlens = plain(cu_seqlens)
    total = optional_index(total, "total")
    host_values = host(cu_seqlens, cu_seqlens_host)
    if total is None and host_values is None:
        host_values = TORCH.to_list(cu_seqlens)
    return _tree_position_ids(cu_seqlens, plain(subtree_end), host_values, total)


@torch.library.custom_op("packsched::shift_labels", mutates_args=())
def _shift_labels(
    ids: Tensor,
    cu_seqlens: Tensor,
    ignore_index: int,
    cu_seqlens_padded: Optional[Tensor],
    cu_seqlens_host: Optional[List[int]],
    cu_seqlens_padded_host: Optional[List[int]],
    total: Optional[int],
) -> Tensor:
    check_dtypes("ShiftLabels", ids=ids, cu_seqlens=cu_seqlens, cu_seqlens_padded=cu_seqlens_padded)
    return _packing._shift_labels(
        TORCH,
        ids,
        cu_seqlens,
        ignore_index,
        cu_seqlens_padded,
        cu_seqlens_host,
        cu_seqlens_padded_host,
        total,
    )


@_shift_labels.register_fake
def _(ids, cu_seqlens, ignore_index, cu_seqlens_padded, cu_seqlens_host, padded_host, total):
    check_dtypes("ShiftLabels", ids=ids, cu_seqlens=cu_seqlens, cu_seqlens_padded=cu_seqlens_padded)
    return ids.new_empty(tuple(ids.shape))


def shift_labels(
    ids, cu_seqlens, ignore_index, cu_seqlens_padded, cu_seqlens_host, cu_seqlens_padded_host, total
):
    cu_seqlens, cu_seqlens_padded = plain(cu_seqlens), plain(cu_seqlens_padded)
    return _shift_labels(
        plain(ids),
        cu_seqlens,
        integer(ignore_index),
        cu_seqlens_padded,
        host(cu_seqlens, cu_seqlens_host),
        None
        if cu_seqlens_padded is None
        else host(cu_seqlens_padded, cu_seqlens_padded_host, "cu_seqlens_padded"),
        optional_index(total, "total"),
    )
