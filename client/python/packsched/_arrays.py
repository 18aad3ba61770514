"""Array adapters of packsched.kernels: which library a tensor comes from (torch, numpy, cupy, or
another host DLPack producer), how to allocate outputs like it, and the host-side argument checks
every kernel wrapper shares (offsets on the host, the rows of a layout with a tail)."""

import operator

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


def _is_float64(lib, x):
    return x.dtype == (lib.torch.float64 if isinstance(lib, _Torch) else lib.np.float64)
