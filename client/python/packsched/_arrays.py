"""Array adapters of packsched.kernels: which library a tensor comes from (torch, numpy, cupy, or
another host DLPack producer), how to allocate outputs like it, the host-side argument checks
every kernel wrapper shares (offsets on the host, the rows of a layout with a tail), and the way to
the torch custom ops (``_torch_ops``, imported with the first torch tensor)."""

import operator

_KDLCUDA = 2


class _Torch:
    @property
    def torch(self):
        # Imported on first use (a torch tensor exists by then), not at construction: the
        # adapters all exist from the start, so tracing a first call mutates no module state.
        import torch

        return torch

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
    @property
    def np(self):
        import numpy

        return numpy

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
    @property
    def np(self):
        import cupy

        return cupy

    def empty(self, shape, dtype, like):
        with like.device:
            return self.np.empty(tuple(shape), dtype=self.dtype(dtype, like))

    def tensor(self, values, dtype, like):
        with like.device:
            return self.np.asarray(values, dtype=self.dtype(dtype, like))

    def stream(self, x):
        return self.np.cuda.get_current_stream().ptr


_LIBS = {"torch": _Torch(), "numpy": _Numpy(), "cupy": _Cupy()}


def _lib_of(x):
    """The adapter of x's library, and x itself (converted for other host producers: to numpy, or
    to torch for a dtype numpy lacks, such as bfloat16, when torch is installed)."""
    module = type(x).__module__.split(".")[0]
    if module in ("torch", "numpy", "cupy"):
        return _adapter(module), x
    if hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] != _KDLCUDA:
        return _lib_of(_from_host_producer(x))
    raise TypeError(
        f"expected a torch tensor, numpy array, cupy array or host DLPack producer, "
        f"got {type(x).__name__}"
    )


def _adapter(module):
    """The adapter of a library by name: "torch", "numpy" or "cupy"."""
    return _LIBS[module]


def _from_host_producer(x):
    """A numpy array (else a torch tensor) of the host DLPack producer x; ValueError when neither
    library reads its dtype."""
    import numpy

    try:
        return numpy.from_dlpack(x)
    except (RuntimeError, BufferError, TypeError) as numpy_error:
        try:
            import torch
        except ModuleNotFoundError:
            torch = None
        if torch is not None:
            try:
                return torch.from_dlpack(x)
            except (RuntimeError, BufferError, TypeError):
                pass
        raise ValueError(
            f"unsupported dtype of a {type(x).__name__} DLPack producer: {numpy_error}"
        ) from numpy_error


def _torch_ops():
    """The torch path of the kernels: packsched._torch_ops, which registers the custom ops when
    first imported (by packsched.kernels if torch was imported before it, else here, with the
    first torch tensor). No module state is set here, so a first call that torch.compile traces
    leaves nothing for its guards to trip on."""
    from . import _torch_ops

    return _torch_ops


def _same_lib(lib, x):
    """x as a contiguous tensor of lib (converted through DLPack if it comes from elsewhere)."""
    other, x = _lib_of(x)
    if other is not lib:
        if isinstance(lib, _Torch):
            x = lib.torch.from_dlpack(x)
        else:
            x = lib.np.from_dlpack(x)
    return lib.contiguous(x)


def _host(lib, cu, cu_host, name="cu_seqlens"):
    """The host values of an offsets tensor (from cu_host when given, else copied from cu)."""
    _check_offsets(cu, name)
    if cu_host is not None:
        return _host_list(cu_host, name)
    return lib.to_list(cu)


def _check_offsets(cu, name):
    """ValueError unless the offsets tensor cu is 1-D with at least one entry."""
    shape = tuple(cu.shape)
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(
            f"{name} must be a 1-D int32 tensor of B + 1 >= 1 offsets, got shape " f"{list(shape)}"
        )


def _host_list(cu_host, name, keep=()):
    """cu_host (any iterable of ints) as a list of Python ints, values of the types in ``keep``
    (torch.SymInt when tracing) as they are; ValueError when it is empty."""
    host = [v if isinstance(v, keep) else int(v) for v in cu_host]
    if not host:
        raise ValueError(f"{name}_host must hold B + 1 >= 1 offsets, got an empty list")
    return host


def _index(value, name):
    """value as an int (operator.index); TypeError naming the argument otherwise."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def _rows(total, end, name="total"):
    """The rows of a layout whose offsets end at ``end`` (the C++ `rows` argument): ``end`` (no
    tail) when ``total`` is None, else ``total``, an int of at least ``end`` (rows past ``end``
    are the tail)."""
    if total is None:
        return end
    rows = _index(total, name)
    if rows < end:
        raise ValueError(
            f"{name} = {rows} must be at least the layout's last offset {end} "
            "(rows past it are the tail)"
        )
    return rows


def _is_float64(lib, x):
    return x.dtype == (lib.torch.float64 if isinstance(lib, _Torch) else lib.np.float64)
