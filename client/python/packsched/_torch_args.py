"""Shared by the torch custom ops (packsched._torch_ops): the dtypes the kernels take, the public
functions' arguments in the forms a custom-op schema accepts (tensors, ints that stay symbolic
while torch.compile traces, lists of them, floats, bools), and the autograd registration of the
differentiable ops."""

import torch

from ._arrays import _adapter, _check_offsets, _host_list, _index, _same_lib

TORCH = _adapter("torch")  # allocation, detach and streams of torch tensors (_arrays)

# What DLPack carries to the kernels: the C++ then checks each argument's role (copy kernels take
# any of these, offsets int32, ...). Complex, float8, quantized and sub-byte dtypes are refused
# here, by name, before any export.
_CARRIED = frozenset(
    (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    )
)
# The floating dtypes of attention and cross entropy (the CPU backend runs each of them).
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dtype_name(dtype):
    """'bfloat16' for torch.bfloat16: the name the C++ messages use for the dtypes they know."""
    return str(dtype).removeprefix("torch.")


def check_dtypes(op, floats=(), **tensors):
    """ValueError "<op>: unsupported dtype for <name>: <dtype>" for a tensor argument (by name;
    None skipped) of a dtype DLPack does not carry to the kernels, or, for the names in
    ``floats``, of any dtype but float16, bfloat16, float32 and float64 (the C++ message, raised
    before the call so that the fake implementations raise it while torch.compile traces)."""
    for name, t in tensors.items():
        if t is None:
            continue
        if name in floats and t.dtype not in _FLOATS:
            raise ValueError(
                f"{op}: unsupported dtype for {name}: {dtype_name(t.dtype)} "
                "(float16, bfloat16, float32 or float64)"
            )
        if t.dtype not in _CARRIED:
            raise ValueError(f"{op}: unsupported dtype for {name}: {dtype_name(t.dtype)}")


def acc_dtype(t):
    """The accumulation dtype of the kernels for floating input t: float64 for float64, else
    float32 (attention's lse, multi-target losses)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def tensor(x):
    """x as a torch tensor: torch tensors as they are (autograd intact), None as None, other
    DLPack producers through torch.from_dlpack (the kernels' mixed-input rule)."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    return _same_lib(TORCH, x)


def plain(x):
    """x as a torch tensor outside autograd (the inputs of the ops that have no gradient)."""
    x = tensor(x)
    return None if x is None else x.detach()


def integer(x):
    """An int argument: ints and SymInts as they are, else int(x) (numpy ints, 0-d tensors)."""
    return x if isinstance(x, (int, torch.SymInt)) else int(x)


def optional_index(x, name):
    """An optional int argument such as ``total`` (None, an int, a SymInt; TypeError naming it
    otherwise)."""
    if x is None or isinstance(x, (int, torch.SymInt)):
        return x
    return _index(x, name)


def host(cu, cu_host, name="cu_seqlens"):
    """The host offsets a caller gave (or None), checked as the direct path checks them: cu must
    be 1-D and non-empty, cu_host non-empty. SymInts stay symbolic, so a traced call does not
    specialize on them."""
    if cu is not None:
        _check_offsets(cu, name)
    if cu_host is None:
        return None
    return _host_list(cu_host, name, keep=(int, torch.SymInt))


def differentiable(op, backward, setup_context):
    """Registers (backward, setup_context) as the autograd of custom op ``op`` and returns how the
    public functions call it: the op itself, except in eager autograd (grad enabled, a tensor
    argument requiring grad, nothing tracing), where a torch.autograd.Function runs the op and
    the same two functions. Same gradients either way; the Function spares eager callers torch's
    registered-autograd wrapper, which rebuilds the schema's argument list once per argument on
    every call (torch._library.utils.fill_defaults: quadratic in the argument count)."""
    op.register_autograd(backward, setup_context=setup_context)

    def forward(*args):
        return op(*args)

    def eager_setup_context(ctx, inputs, output):
        setup_context(ctx, inputs, output)

    def eager_backward(ctx, *grads):
        return backward(ctx, *grads)

    # Named after the op: grad_fn reads e.g. varlen_attention_forwardBackward.
    eager = type(
        op._name,
        (torch.autograd.Function,),
        {
            "forward": staticmethod(forward),
            "setup_context": staticmethod(eager_setup_context),
            "backward": staticmethod(eager_backward),
        },
    )

    def call(*args):
        if (
            torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        ):
            return eager.apply(*args)
        return op(*args)

    return call
