"""Packing kernels for padding-free training: unpad/pad, aligned (THD) packing, position ids,
label shifting and packed cross entropy.

Inputs are any DLPack producer (torch tensors, numpy arrays, cupy arrays, ...). Outputs are
allocated by the input's own library on the input's device (torch tensors for torch inputs,
on torch's current CUDA stream; numpy arrays for numpy inputs); other host producers get numpy
outputs. Inputs that are not contiguous are made contiguous first (a copy).

Packed layout: B sequences stored as rows [0, total) of one tensor, sequence b in rows
[cu_seqlens[b], cu_seqlens[b+1]). ``cu_seqlens`` is int32 [B+1], cu_seqlens[0] == 0,
non-decreasing (empty sequences allowed). Aligned layout: sequence b occupies rows
[cu_seqlens_padded[b], cu_seqlens_padded[b+1]), its real tokens first, pad slots after.

Every function accepts ``cu_seqlens_host`` (a list of ints, e.g. from the packsched plan): with
it, no call needs a device-to-host copy. Without it a CUDA ``cu_seqlens`` is copied to the host
(a sync). Invalid arguments raise ValueError with a message naming the argument.
"""

from . import _kernels

__all__ = [
    "unpad",
    "pad",
    "pack_aligned",
    "unpack_aligned",
    "aligned_cu_seqlens",
    "position_ids",
    "shift_labels",
    "packed_cross_entropy",
    "built_with_cuda",
]

_KDLCUDA = 2


class _Torch:
    def __init__(self):
        import torch

        self.torch = torch

    def dtype(self, name, like):
        return {"int32": self.torch.int32, "int64": self.torch.int64}.get(name, like.dtype)

    def empty(self, shape, dtype, like):
        return self.torch.empty(tuple(shape), dtype=self.dtype(dtype, like), device=like.device)

    def tensor(self, values, dtype, like):
        return self.torch.tensor(values, dtype=self.dtype(dtype, like), device=like.device)

    def contiguous(self, x):
        # Outputs are not tracked by autograd, and torch will not export a tensor that is.
        return x.detach().contiguous()

    def mask(self, mask):
        mask = self.contiguous(mask)
        # DLPack 0.6 has no bool: hand the kernels the same bytes as uint8.
        return mask.view(self.torch.uint8) if mask.dtype == self.torch.bool else mask

    def row_counts(self, mask):
        return (mask != 0).sum(dim=1, dtype=self.torch.int32)

    def to_list(self, x):
        return [int(v) for v in x.tolist()]

    def diff(self, cu):
        return (cu[1:] - cu[:-1]).to(self.torch.int32)

    def stream(self, x):
        if x.is_cuda:
            return self.torch.cuda.current_stream(x.device).cuda_stream
        return 0


class _Numpy:
    def __init__(self):
        import numpy

        self.np = numpy

    def dtype(self, name, like):
        return {"int32": self.np.int32, "int64": self.np.int64}.get(name, like.dtype)

    def empty(self, shape, dtype, like):
        return self.np.empty(tuple(shape), dtype=self.dtype(dtype, like))

    def tensor(self, values, dtype, like):
        return self.np.asarray(values, dtype=self.dtype(dtype, like))

    def contiguous(self, x):
        x = self.np.ascontiguousarray(x)
        # numpy refuses to export read-only arrays over DLPack.
        return x if x.flags.writeable else x.copy()

    def mask(self, mask):
        mask = self.contiguous(mask)
        return mask.view(self.np.uint8) if mask.dtype == self.np.bool_ else mask

    def row_counts(self, mask):
        return (mask != 0).sum(axis=1, dtype=self.np.int32)

    def to_list(self, x):
        return [int(v) for v in x.tolist()]

    def diff(self, cu):
        return (cu[1:] - cu[:-1]).astype(self.np.int32)

    def stream(self, x):
        return 0


class _Cupy(_Numpy):
    def __init__(self):
        import cupy

        self.np = cupy

    def empty(self, shape, dtype, like):
        with like.device:
            return self.np.empty(tuple(shape), dtype=self.dtype(dtype, like))

    def tensor(self, values, dtype, like):
        with like.device:
            return self.np.asarray(values, dtype=self.dtype(dtype, like))

    def stream(self, x):
        return self.np.cuda.get_current_stream().ptr


_LIBS = {}


def _lib_of(x):
    """The adapter of x's library, and x itself (converted to numpy for other host producers)."""
    module = type(x).__module__.split(".")[0]
    if module in ("torch", "numpy", "cupy"):
        if module not in _LIBS:
            _LIBS[module] = {"torch": _Torch, "numpy": _Numpy, "cupy": _Cupy}[module]()
        return _LIBS[module], x
    if hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] != _KDLCUDA:
        import numpy

        return _lib_of(numpy.from_dlpack(x))
    raise TypeError(f"expected a torch tensor, numpy array, cupy array or host DLPack producer, "
                    f"got {type(x).__name__}")


def _same_lib(lib, x):
    """x as a contiguous tensor of lib (converted through DLPack if it comes from elsewhere)."""
    other, x = _lib_of(x)
    if other is not lib:
        if isinstance(lib, _Torch):
            x = lib.torch.utils.dlpack.from_dlpack(x)
        else:
            x = lib.np.from_dlpack(x)
    return lib.contiguous(x)


def _host(lib, cu, cu_host):
    if cu_host is not None:
        return [int(v) for v in cu_host]
    return lib.to_list(cu)


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
    x = lib.contiguous(x)
    mask = lib.mask(_same_lib(lib, mask))
    if cu_seqlens is None:
        counts = lib.to_list(lib.row_counts(mask))
        host = [0]
        for c in counts:
            host.append(host[-1] + c)
        cu_seqlens = lib.tensor(host, "int32", x)
    else:
        cu_seqlens = _same_lib(lib, cu_seqlens)
        host = _host(lib, cu_seqlens, cu_seqlens_host)
    total = host[-1]
    max_seqlen = max((host[b + 1] - host[b] for b in range(len(host) - 1)), default=0)
    x_packed = lib.empty((total,) + tuple(x.shape[2:]), None, x)
    indices = lib.empty((total,), "int64", x)
    _kernels.unpad(x, mask, cu_seqlens, host, x_packed, indices, lib.stream(x))
    return x_packed, indices, cu_seqlens, max_seqlen, lib.diff(cu_seqlens)


def pad(x_packed, indices, batch, seqlen):
    """Inverse of unpad: returns x [batch, seqlen, ...] (x_packed's dtype) with
    x.flat[indices[i]] = x_packed[i] and every other row zero. indices: int64 [total], distinct,
    in [0, batch*seqlen)."""
    lib, x_packed = _lib_of(x_packed)
    x_packed = lib.contiguous(x_packed)
    indices = _same_lib(lib, indices)
    x = lib.empty((int(batch), int(seqlen)) + tuple(x_packed.shape[1:]), None, x_packed)
    _kernels.pad(x_packed, indices, x, lib.stream(x_packed))
    return x


def pack_aligned(x_packed, cu_seqlens, align, pad_value=0, cu_seqlens_host=None):
    """Re-lays a packed batch out so each sequence starts at a multiple of ``align`` rows
    (TransformerEngine THD with padding). Pad slots hold ``pad_value`` (0 for hidden states, the
    pad token id for input ids); use shift_labels / position_ids on the aligned layout for their
    labels (ignore_index) and positions (the count continues).

    x_packed: [total, ...] any dtype; cu_seqlens: int32 [B+1]. Returns (x_aligned
    [total_padded, ...] x_packed's dtype, cu_seqlens_padded int32 [B+1], seqused int32 [B] real
    lengths)."""
    lib, x_packed = _lib_of(x_packed)
    x_packed = lib.contiguous(x_packed)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    padded = aligned_cu_seqlens(host, align)
    x_aligned = lib.empty((padded[-1],) + tuple(x_packed.shape[1:]), None, x_packed)
    cu_padded = lib.empty((len(host),), "int32", x_packed)
    seqused = lib.empty((len(host) - 1,), "int32", x_packed)
    _kernels.pack_aligned(x_packed, cu_seqlens, host, int(align), float(pad_value), x_aligned,
                          cu_padded, seqused, lib.stream(x_packed))
    return x_aligned, cu_padded, seqused


def unpack_aligned(x_aligned, cu_seqlens, cu_seqlens_padded, cu_seqlens_host=None,
                   cu_seqlens_padded_host=None):
    """Drops the pad slots of an aligned layout. x_aligned: [total_padded, ...] any dtype;
    cu_seqlens, cu_seqlens_padded: int32 [B+1] (any padding with padded lengths >= real
    lengths). Returns x_packed [total, ...] of x_aligned's dtype."""
    lib, x_aligned = _lib_of(x_aligned)
    x_aligned = lib.contiguous(x_aligned)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    cu_seqlens_padded = _same_lib(lib, cu_seqlens_padded)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    padded_host = _host(lib, cu_seqlens_padded, cu_seqlens_padded_host)
    x_packed = lib.empty((host[-1],) + tuple(x_aligned.shape[1:]), None, x_aligned)
    _kernels.unpack_aligned(x_aligned, cu_seqlens, host, cu_seqlens_padded, padded_host, x_packed,
                            lib.stream(x_aligned))
    return x_packed


def position_ids(cu_seqlens, total=None, cu_seqlens_host=None):
    """int64 [total]: pos[t] = t - start of t's sequence. ``total`` defaults to cu_seqlens[-1]
    and must equal it. Pass the padded offsets of an aligned layout to give its pad slots
    positions that continue the count."""
    lib, cu_seqlens = _lib_of(cu_seqlens)
    cu_seqlens = lib.contiguous(cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    out = lib.empty((host[-1] if total is None else int(total),), "int64", cu_seqlens)
    _kernels.position_ids(cu_seqlens, host, out, lib.stream(cu_seqlens))
    return out


def shift_labels(ids, cu_seqlens, ignore_index=-100, cu_seqlens_padded=None,
                 cu_seqlens_host=None, cu_seqlens_padded_host=None):
    """labels[t] = ids[t+1] inside a sequence, ``ignore_index`` at each sequence's last real
    token and on pad slots; never across a boundary. ids: int32 or int64 [rows], in the packed
    layout of cu_seqlens, or in the aligned layout of cu_seqlens_padded when given (cu_seqlens
    then gives the real lengths). Returns labels [rows] of ids' dtype."""
    lib, ids = _lib_of(ids)
    ids = lib.contiguous(ids)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    padded_host = None
    if cu_seqlens_padded is not None:
        cu_seqlens_padded = _same_lib(lib, cu_seqlens_padded)
        padded_host = _host(lib, cu_seqlens_padded, cu_seqlens_padded_host)
    labels = lib.empty(tuple(ids.shape), None, ids)
    _kernels.shift_labels(ids, cu_seqlens, host, cu_seqlens_padded, padded_host, int(ignore_index),
                          labels, lib.stream(ids))
    return labels


def packed_cross_entropy(logits, labels, cu_seqlens, ignore_index=-100, cu_seqlens_host=None):
    """Cross entropy over packed logits with already-shifted labels (shift_labels' output).

    logits: [rows, V] float16, bfloat16, float32 or float64; labels: int32/int64 [rows],
    ignore_index or in [0, V); cu_seqlens: int32 [B+1] over the rows (real or padded offsets).
    Returns (per_token_loss [rows], per_sequence_sum [B], per_sequence_count int64 [B]): loss in
    nats, -log softmax(logits[t])[labels[t]], 0 where ignored; losses and sums in logits' dtype
    (16-bit inputs accumulate in float32, float64 in float64); counts of non-ignored tokens.
    """
    lib, logits = _lib_of(logits)
    logits = lib.contiguous(logits)
    labels = _same_lib(lib, labels)
    cu_seqlens = _same_lib(lib, cu_seqlens)
    host = _host(lib, cu_seqlens, cu_seqlens_host)
    batch = len(host) - 1
    loss = lib.empty((host[-1],), None, logits)
    sums = lib.empty((batch,), None, logits)
    counts = lib.empty((batch,), "int64", logits)
    _kernels.packed_cross_entropy(logits, labels, cu_seqlens, host, int(ignore_index), loss, sums,
                                  counts, lib.stream(logits))
    return loss, sums, counts
