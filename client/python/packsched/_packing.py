"""The packing kernels of packsched.kernels (unpad/pad, aligned layouts, position ids, label
shifting); see that module's docstring for the layouts and the tail. Torch tensors go through the
custom ops of packsched._ops_packing, whose implementations are the private ``_name(lib, ...)``
functions here (the direct path of numpy and other arrays)."""

from . import _kernels
from ._arrays import _host, _lib_of, _rows, _same_lib, _Torch, _torch_ops


def built_with_cuda():
    """True when the extension contains the CUDA backend."""
    return _kernels.built_with_cuda()


def aligned_cu_seqlens(cu_seqlens, align):
    """Host padded offsets: each length of ``cu_seqlens`` (a list of B+1 ints) rounded up to a
    multiple of ``align``. Returns a list of B+1 ints."""
    return _kernels.aligned_cu_seqlens([int(v) for v in cu_seqlens], int(align))


def unpad(x, mask, cu_seqlens=None, cu_seqlens_host=None):
    """Packs the token rows of a padded batch, like FlashAttention's ``unpad_input``.

    x: [B, S, ...] any dtype. mask: [B, S] bool, uint8, int32 or int64, nonzero = token (tokens
    may sit anywhere in a row). cu_seqlens (optional, int32 [B+1]) and cu_seqlens_host (optional
    list): the metadata if already known (e.g. from the plan); otherwise it is computed from the
    mask (on a GPU that is one device-to-host sync).

    Returns (x_packed [total, ...] x's dtype, indices int64 [total] into the flattened [B*S],
    cu_seqlens int32 [B+1], max_seqlen int (tokens), seqused int32 [B] tokens per row).
    """
    lib, x = _lib_of(x)
    if isinstance(lib, _Torch):
        return _torch_ops().unpad(x, mask, cu_seqlens, cu_seqlens_host)
    x_packed, indices, cu_seqlens, host = _unpad(lib, x, mask, cu_seqlens, cu_seqlens_host)
    return x_packed, indices, cu_seqlens, _max_length(host), lib.diff(cu_seqlens)


def _max_length(host):
    """The longest sequence of host offsets (0 for none)."""
    longest = 0  # a loop, not max(..., default=0): dynamo before torch 2.5 cannot trace default=
    for b in range(len(host) - 1):
        longest = max(longest, host[b + 1] - host[b])
    return longest


def _unpad_offsets(lib, x, mask, cu_seqlens, cu_seqlens_host):
    """(cu_seqlens, host offsets) of unpad: as given, or counted from the mask (a lib.mask)."""
    if cu_seqlens is None:
        counts = lib.to_list(lib.row_counts(mask))
        host = [0]
        for c in counts:
            host.append(host[-1] + c)
        return lib.tensor(host, "int32", x), host
    cu_seqlens = _same_lib(lib, cu_seqlens)
    return cu_seqlens, _host(lib, cu_seqlens, cu_seqlens_host)


def _unpad(lib, x, mask, cu_seqlens, cu_seqlens_host):
    """(x_packed, indices, cu_seqlens, host offsets) of unpad."""
    x = lib.contiguous(x)
    mask = lib.mask(_same_lib(lib, mask))
    cu_seqlens, host = _unpad_offsets(lib, x, mask, cu_seqlens, cu_seqlens_host)
    total = host[-1]
    x_packed = lib.empty((total,) + tuple(x.shape[2:]), None, x)
    indices = lib.empty((total,), "int64", x)
    _kernels.unpad(x, mask, cu_seqlens, host, x_packed, indices, lib.stream(x))
    return x_packed, indices, cu_seqlens, host


def pad(x_packed, indices, batch, seqlen):
    """Inverse of unpad: returns x [batch, seqlen, ...] (x_packed's dtype) with
    x.flat[indices[i]] = x_packed[i] and every other row zero. indices: int64 [total], distinct,
    in [0, batch*seqlen)."""
    lib, x_packed = _lib_of(x_packed)
    if isinstance(lib, _Torch):
        return _torch_ops().pad(x_packed, indices, batch, seqlen)
    return _pad(lib, x_packed, indices, batch, seqlen)


def _pad(lib, x_packed, indices, batch, seqlen):
    x_packed = lib.contiguous(x_packed)
    indices = _same_lib(lib, indices)
    x = lib.empty((int(batch), int(seqlen)) + tuple(x_packed.shape[1:]), None, x_packed)
    _kernels.pad(x_packed, indices, x, lib.stream(x_packed))
    return x


def pack_aligned(x_packed, cu_seqlens, align, pad_value=0, cu_seqlens_host=None, *, total=None):
    """Re-lays a packed batch out so each sequence starts at a multiple of ``align`` rows
    (TransformerEngine THD with padding). Pad slots hold ``pad_value`` (0 for hidden states, the
    pad token id for input ids); use shift_labels / position_ids on the aligned layout for their
    labels (ignore_index) and positions (the count continues).

    x_packed: [n, ...] any dtype; cu_seqlens: int32 [B+1]. total: the rows of the result (the
    plan's ``MicroBatch.total``, >= total_padded); rows past total_padded are the tail (module
    docstring), filled with ``pad_value``. Returns (x_aligned [total or total_padded, ...]
    x_packed's dtype, cu_seqlens_padded int32 [B+1] (the tail is not in them), seqused int32 [B]
    real lengths)."""
    lib, x_packed = _lib_of(x_packed)
    if isinstance(lib, _Torch):
        return _torch_ops().pack_aligned(
            x_packed, cu_seqlens, align, pad_value, cu_seqlens_host, total
        )
    return _pack_aligned(lib, x_packed, cu_seqlens, align, pad_value, cu_seqlens_host, total)


def _pack_aligned(lib, x_packed, cu_seqlens, align, pad_value, cu_seqlens_host, total):
    x_packed = lib.contiguous(x_packed)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    padded = aligned_cu_seqlens(host, align)
    rows = _rows(total, padded[-1])
    x_aligned = lib.empty((rows,) + tuple(x_packed.shape[1:]), None, x_packed)
    cu_padded = lib.empty((len(host),), "int32", x_packed)
    seqused = lib.empty((len(host) - 1,), "int32", x_packed)
    _kernels.pack_aligned(
        x_packed,
        cu_seqlens,
        host,
        int(align),
        rows,
        float(pad_value),
        x_aligned,
        cu_padded,
        seqused,
        lib.stream(x_packed),
    )
    return x_aligned, cu_padded, seqused


def unpack_aligned(
    x_aligned,
    cu_seqlens,
    cu_seqlens_padded,
    cu_seqlens_host=None,
    cu_seqlens_padded_host=None,
    *,
    total=None,
):
    """Drops the pad slots (and the tail) of an aligned layout. x_aligned: [total_padded, ...]
    any dtype, or [total, ...] with a tail when ``total`` is given; cu_seqlens, cu_seqlens_padded:
    int32 [B+1] (any padding with padded lengths >= real lengths). Returns x_packed
    [cu_seqlens[-1], ...] of x_aligned's dtype."""
    lib, x_aligned = _lib_of(x_aligned)
    args = (x_aligned, cu_seqlens, cu_seqlens_padded, cu_seqlens_host, cu_seqlens_padded_host)
    if isinstance(lib, _Torch):
        return _torch_ops().unpack_aligned(*args, total)
    return _unpack_aligned(lib, *args, total)


def _unpack_aligned(
    lib, x_aligned, cu_seqlens, cu_seqlens_padded, cu_seqlens_host, cu_seqlens_padded_host, total
):
    x_aligned = lib.contiguous(x_aligned)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    cu_seqlens_padded = _same_lib(lib, cu_seqlens_padded)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    padded_host = _host(lib, cu_seqlens_padded, cu_seqlens_padded_host, "cu_seqlens_padded")
    x_packed = lib.empty((host[-1],) + tuple(x_aligned.shape[1:]), None, x_aligned)
    _kernels.unpack_aligned(
        x_aligned,
        cu_seqlens,
        host,
        cu_seqlens_padded,
        padded_host,
        _rows(total, padded_host[-1]),
        x_packed,
        lib.stream(x_aligned),
    )
    return x_packed


def position_ids(cu_seqlens, total=None, cu_seqlens_host=None):
    """int64 [total]: pos[t] = t - start of t's sequence. ``total`` defaults to cu_seqlens[-1];
    a larger value declares a tail, whose positions restart at 0 (0, 1, ... up to the last row).
    Pass the padded offsets of an aligned layout to give its pad slots positions that continue
    the count."""
    lib, cu_seqlens = _lib_of(cu_seqlens)
    if isinstance(lib, _Torch):
        return _torch_ops().position_ids(cu_seqlens, total, cu_seqlens_host)
    return _position_ids(lib, cu_seqlens, total, cu_seqlens_host)


def _position_ids(lib, cu_seqlens, total, cu_seqlens_host):
    cu_seqlens = lib.contiguous(cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    rows = _rows(total, host[-1])
    out = lib.empty((rows,), "int64", cu_seqlens)
    _kernels.position_ids(cu_seqlens, host, rows, out, lib.stream(cu_seqlens))
    return out


def shift_labels(
    ids,
    cu_seqlens,
    ignore_index=-100,
    cu_seqlens_padded=None,
    cu_seqlens_host=None,
    cu_seqlens_padded_host=None,
    *,
    total=None,
):
    """labels[t] = ids[t+1] inside a sequence, ``ignore_index`` at each sequence's last real
    token, on pad slots and on tail rows; never across a boundary. ids: int32 or int64 [rows], in
    the packed layout of cu_seqlens, or in the aligned layout of cu_seqlens_padded when given
    (cu_seqlens then gives the real lengths). ``total``: rows = total with a tail past the
    layout's last offset (module docstring). Returns labels [rows] of ids' dtype."""
    lib, ids = _lib_of(ids)
    args = (ids, cu_seqlens, ignore_index, cu_seqlens_padded, cu_seqlens_host)
    if isinstance(lib, _Torch):
        return _torch_ops().shift_labels(*args, cu_seqlens_padded_host, total)
    return _shift_labels(lib, *args, cu_seqlens_padded_host, total)


def _shift_labels(
    lib,
    ids,
    cu_seqlens,
    ignore_index,
    cu_seqlens_padded,
    cu_seqlens_host,
    cu_seqlens_padded_host,
    total,
):
    ids = lib.contiguous(ids)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    padded_host = None
    if cu_seqlens_padded is not None:
        cu_seqlens_padded = _same_lib(lib, cu_seqlens_padded)
        padded_host = _host(lib, cu_seqlens_padded, cu_seqlens_padded_host, "cu_seqlens_padded")
    labels = lib.empty(tuple(ids.shape), None, ids)
    rows = _rows(total, host[-1] if padded_host is None else padded_host[-1])
    _kernels.shift_labels(
        ids,
        cu_seqlens,
        host,
        cu_seqlens_padded,
        padded_host,
        rows,
        int(ignore_index),
        labels,
        lib.stream(ids),
    )
    return labels
