"""Kernels for padding-free training: unpad/pad, aligned (THD) packing, position ids, label
shifting, packed cross entropy, and varlen attention (forward, backward, torch autograd).

Inputs are any DLPack producer (torch tensors, numpy arrays, cupy arrays, ...). Outputs are
allocated by the input's own library on the input's device (torch tensors for torch inputs,
on torch's current CUDA stream; numpy arrays for numpy inputs); other host producers get numpy
outputs. Inputs that are not contiguous are made contiguous first (a copy).

Packed layout: B sequences stored as rows [0, total) of one tensor, sequence b in rows
[cu_seqlens[b], cu_seqlens[b+1]). ``cu_seqlens`` is int32 [B+1], cu_seqlens[0] == 0,
non-decreasing (empty sequences allowed). Aligned layout: sequence b occupies rows
[cu_seqlens_padded[b], cu_seqlens_padded[b+1]), its real tokens first, pad slots after.

Tail: a plan made with ``align_total_to > 1`` (Ulysses sequence parallelism) gives each
micro-batch ``total`` rows, more than its offsets cover. Pass ``total=`` (the plan's
``MicroBatch.total``) to declare rows [offsets[-1], total) as the tail: pack_aligned fills it with
``pad_value``, position_ids restart at 0 there (verl's Ulysses padding), shift_labels gives
``ignore_index``, packed_cross_entropy gives loss 0 (and zero gradient), attention never uses its
rows as keys and gives them out 0 / lse +inf (and zero gradients), unpack_aligned drops it.
Without ``total=`` the rows must match the offsets exactly.

Every function accepts ``cu_seqlens_host`` (a list of ints, e.g. from the packsched plan): with
it, no call needs a device-to-host copy. Without it a CUDA ``cu_seqlens`` is copied to the host
(a sync). Invalid arguments raise ValueError with a message naming the argument.
"""

import operator

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
    "varlen_attention",
    "varlen_attention_forward",
    "varlen_attention_backward",
    "cp_layout",
    "cp_shard",
    "cp_unshard",
    "cp_position_ids",
    "cp_shift_labels",
    "cp_attention",
    "cp_cross_entropy",
    "mrope_position_ids",
]

_KDLCUDA = 2


class _Torch:
    def __init__(self):
        import torch

        self.torch = torch

    def dtype(self, name, like):
        return {
            "int32": self.torch.int32,
            "int64": self.torch.int64,
            "float32": self.torch.float32,
            "float64": self.torch.float64,
        }.get(name, like.dtype)

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
        return {
            "int32": self.np.int32,
            "int64": self.np.int64,
            "float32": self.np.float32,
            "float64": self.np.float64,
        }.get(name, like.dtype)

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
    raise TypeError(
        f"expected a torch tensor, numpy array, cupy array or host DLPack producer, "
        f"got {type(x).__name__}"
    )


def _same_lib(lib, x):
    """x as a contiguous tensor of lib (converted through DLPack if it comes from elsewhere)."""
    other, x = _lib_of(x)
    if other is not lib:
        if isinstance(lib, _Torch):
            x = lib.torch.utils.dlpack.from_dlpack(x)
        else:
            x = lib.np.from_dlpack(x)
    return lib.contiguous(x)


def _host(lib, cu, cu_host, name="cu_seqlens"):
    """The host values of an offsets tensor (from cu_host when given, else copied from cu)."""
    shape = tuple(cu.shape)
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(
            f"{name} must be a 1-D int32 tensor of B + 1 >= 1 offsets, got shape " f"{list(shape)}"
        )
    if cu_host is not None:
        host = [int(v) for v in cu_host]
        if not host:
            raise ValueError(f"{name}_host must hold B + 1 >= 1 offsets, got an empty list")
        return host
    return lib.to_list(cu)


def _rows(total, end, name="total"):
    """The rows of a layout whose offsets end at ``end`` (the C++ `rows` argument): ``end`` (no
    tail) when ``total`` is None, else ``total``, an int of at least ``end`` (rows past ``end``
    are the tail)."""
    if total is None:
        return end
    try:
        rows = operator.index(total)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(total).__name__}") from None
    if rows < end:
        raise ValueError(
            f"{name} = {rows} must be at least the layout's last offset {end} "
            "(rows past it are the tail)"
        )
    return rows


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


def _is_float64(lib, x):
    return x.dtype == (lib.torch.float64 if isinstance(lib, _Torch) else lib.np.float64)


class _AttentionLayout:
    """The layout arguments of one attention call, converted once for the forward and backward."""

    def __init__(
        self,
        lib,
        like,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        window_size,
        softcap,
        seqused_q,
        seqused_k,
        cu_seqlens_q_host,
        cu_seqlens_k_host,
        total_q=None,
        total_k=None,
    ):
        self.cu_q = _same_lib(lib, cu_seqlens_q)
        self.cu_k = _same_lib(lib, cu_seqlens_k)
        self.host_q = _host(lib, self.cu_q, cu_seqlens_q_host, "cu_seqlens_q")
        self.host_k = _host(lib, self.cu_k, cu_seqlens_k_host, "cu_seqlens_k")
        self.seqused_q = None if seqused_q is None else _same_lib(lib, seqused_q)
        self.seqused_k = None if seqused_k is None else _same_lib(lib, seqused_k)
        left, right = window_size
        self.kwargs = dict(
            rows_q=_rows(total_q, self.host_q[-1], "total_q"),
            rows_k=_rows(total_k, self.host_k[-1], "total_k"),
            max_seqlen_q=int(max_seqlen_q),
            max_seqlen_k=int(max_seqlen_k),
            softmax_scale=None if softmax_scale is None else float(softmax_scale),
            causal=bool(causal),
            window_left=int(left),
            window_right=int(right),
            softcap=float(softcap),
        )

    def args(self):
        return dict(
            cu_seqlens_q=self.cu_q,
            cu_seqlens_q_host=self.host_q,
            cu_seqlens_k=self.cu_k,
            cu_seqlens_k_host=self.host_k,
            seqused_q=self.seqused_q,
            seqused_k=self.seqused_k,
            **self.kwargs,
        )


def _forward(lib, q, k, v, layout):
    q = lib.contiguous(q)
    k = _same_lib(lib, k)
    v = _same_lib(lib, v)
    out = lib.empty(tuple(q.shape), None, q)
    lse = lib.empty((q.shape[1], q.shape[0]), "float64" if _is_float64(lib, q) else "float32", q)
    _kernels.varlen_attention_forward(
        q, k, v, out=out, lse=lse, stream=lib.stream(q), **layout.args()
    )
    return out, lse


def _backward(lib, dout, q, k, v, out, lse, layout):
    q = lib.contiguous(q)
    dout, k, v, out, lse = (_same_lib(lib, x) for x in (dout, k, v, out, lse))
    dq = lib.empty(tuple(q.shape), None, q)
    dk = lib.empty(tuple(k.shape), None, k)
    dv = lib.empty(tuple(v.shape), None, v)
    _kernels.varlen_attention_backward(
        dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, stream=lib.stream(q), **layout.args()
    )
    return dq, dk, dv


def varlen_attention_forward(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    seqused_q=None,
    seqused_k=None,
    *,
    cu_seqlens_q_host=None,
    cu_seqlens_k_host=None,
    total_q=None,
    total_k=None,
):
    """Varlen attention forward (FlashAttention's varlen semantics, no autograd).

    q: [tq, H, D], k and v: [tk, Hk, D] (float16, bfloat16, float32; float64 on the CPU), H a
    multiple of Hk (GQA: head h reads kv head h // (H // Hk)), D a multiple of 8 up to 256.
    cu_seqlens_q/k: int32 [B+1] segment offsets (padded offsets for an aligned layout, with
    seqused_q/k: int32 [B] the real lengths). max_seqlen_q/k: ints >= the longest segment.
    softmax_scale: default D ** -0.5, finite as a float32. causal: bottom-right aligned (query i
    sees key j iff j <= i + sk - sq). window_size: (left, right), -1 = unbounded; as in
    FlashAttention's varlen API a side >= max_seqlen_k is unbounded too (which lets every row of a
    sequence with sq > sk see all keys when the right side is). softcap: 0 = off, else a normal
    positive float32; scores become softcap * tanh(s / softcap). The keyword-only
    cu_seqlens_q_host / cu_seqlens_k_host (lists) spare a GPU caller the device-to-host copy of
    the offsets. The keyword-only total_q / total_k
    declare a tail (rows of q resp. k past the last offset; module docstring): never keys, out 0
    and lse +inf on its query rows, zero gradients.

    Returns (out [tq, H, D] q's dtype, lse [H, tq] float32 (float64 for float64 q), natural log
    of each row's softmax denominator, scale included). A row that sees no key (and every pad
    slot) gets out = 0 and lse = +inf.
    """
    lib, q = _lib_of(q)
    layout = _AttentionLayout(
        lib,
        q,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        window_size,
        softcap,
        seqused_q,
        seqused_k,
        cu_seqlens_q_host,
        cu_seqlens_k_host,
        total_q,
        total_k,
    )
    return _forward(lib, q, k, v, layout)


def varlen_attention_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    seqused_q=None,
    seqused_k=None,
    *,
    cu_seqlens_q_host=None,
    cu_seqlens_k_host=None,
    total_q=None,
    total_k=None,
):
    """Gradients (dq, dk, dv) of sum(dout * out) for the (out, lse) that varlen_attention_forward
    returned with the same arguments. dk and dv are summed over each GQA group; pad-slot rows are
    0. Deterministic (bitwise reproducible)."""
    lib, q = _lib_of(q)
    layout = _AttentionLayout(
        lib,
        q,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        window_size,
        softcap,
        seqused_q,
        seqused_k,
        cu_seqlens_q_host,
        cu_seqlens_k_host,
        total_q,
        total_k,
    )
    return _backward(lib, dout, q, k, v, out, lse, layout)


_AUTOGRAD = None


def _autograd_function():
    global _AUTOGRAD
    if _AUTOGRAD is None:
        import torch

        class VarlenAttention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, layout):
                lib = _LIBS["torch"]
                out, lse = _forward(lib, q, k, v, layout)
                ctx.save_for_backward(q, k, v, out, lse)
                ctx.layout = layout
                ctx.mark_non_differentiable(lse)
                return out, lse

            @staticmethod
            def backward(ctx, dout, _dlse):
                q, k, v, out, lse = ctx.saved_tensors
                dq, dk, dv = _backward(_LIBS["torch"], dout, q, k, v, out, lse, ctx.layout)
                return dq, dk, dv, None

        _AUTOGRAD = VarlenAttention
    return _AUTOGRAD


def varlen_attention(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    seqused_q=None,
    seqused_k=None,
    return_lse=False,
    cu_seqlens_q_host=None,
    cu_seqlens_k_host=None,
    total_q=None,
    total_k=None,
):
    """Drop-in for flash_attn_varlen_func (FlashAttention 2.6+): the same sixteen parameters in
    the same positions, so positional and keyword calls (HF transformers, verl) work unchanged.

    - dropout_p must be 0 (attention dropout is not implemented).
    - window_size: as FlashAttention's varlen API, a side >= max_seqlen_k is unbounded.
    - alibi_slopes must be None (ALiBi is not implemented: NotImplementedError); block_table
      (paged KV cache) likewise.
    - deterministic is accepted and changes nothing: the backward pass is always deterministic
      (bitwise reproducible, no atomics).
    - return_attn_probs=True returns (out, softmax_lse, None) like FlashAttention with
      dropout_p = 0: lse [H, tq] float32 (not differentiable); the third entry, FlashAttention's
      S_dmask, is always None (FlashAttention only fills it when dropout_p > 0).

    Beyond FlashAttention (keyword-only): seqused_q/k (int32 [B] real lengths of an aligned
    layout), return_lse (returns (out, lse)), cu_seqlens_q_host/k_host (host offsets: no sync),
    total_q/total_k (the rows of q resp. k when they end with a tail past the last offset).

    For torch tensors this is a torch.autograd.Function: gradients flow to q, k and v through
    varlen_attention_backward. Numpy (and other host DLPack) inputs run the forward only. See
    varlen_attention_forward for shapes and semantics.
    """
    if dropout_p != 0.0:
        raise ValueError(
            f"varlen_attention: dropout_p must be 0, got {dropout_p} "
            f"(attention dropout is not implemented)"
        )
    if alibi_slopes is not None:
        raise NotImplementedError(
            "varlen_attention: alibi_slopes must be None (ALiBi is not " "implemented)"
        )
    if block_table is not None:
        raise NotImplementedError(
            "varlen_attention: block_table must be None (a paged KV cache " "is not implemented)"
        )
    del deterministic  # the backward is always deterministic
    lib, q = _lib_of(q)
    layout = _AttentionLayout(
        lib,
        q,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
        window_size,
        softcap,
        seqused_q,
        seqused_k,
        cu_seqlens_q_host,
        cu_seqlens_k_host,
        total_q,
        total_k,
    )
    if isinstance(lib, _Torch):
        k = _same_lib(lib, k) if not isinstance(k, lib.torch.Tensor) else k
        v = _same_lib(lib, v) if not isinstance(v, lib.torch.Tensor) else v
        out, lse = _autograd_function().apply(q, k, v, layout)
    else:
        out, lse = _forward(lib, q, k, v, layout)
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_lse else out


# Context parallelism and 3-D positions (packsched/_context_parallel.py, which uses the helpers
# above; imported last for that reason).
from ._context_parallel import (  # noqa: E402
    cp_attention,
    cp_cross_entropy,
    cp_layout,
    cp_position_ids,
    cp_shard,
    cp_shift_labels,
    cp_unshard,
    mrope_position_ids,
)

# Tree packing (packsched/tree_kernels.py).
from .tree_kernels import (  # noqa: E402,F401
    multi_target_cross_entropy,
    tree_attention,
    tree_position_ids,
)
