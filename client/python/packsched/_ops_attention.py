"""Varlen and tree attention as torch custom ops (packsched::varlen_attention_forward and
_backward, packsched::tree_attention_forward and _backward), their autograd, and the torch path
of the public attention functions.

Each forward op returns (out [tq, H, D] q's dtype, lse [H, tq] float32, float64 for float64 q),
each backward op (dq, dk, dv) shaped and typed like q, k and v: the fakes need no offsets, so a
traced call never reads them. The host offsets are optional arguments (the implementation reads
the offsets tensor when they are None, as the direct path does). The forward ops are
differentiable in q, k and v (lse is not); the gradient is the backward op.
"""

import torch

from ._attention import _AttentionLayout, _backward, _forward
from ._torch_args import TORCH, acc_dtype, check_dtypes, differentiable, host, integer
from ._torch_args import optional_index, tensor
from .tree_kernels import _TreeLayout

# The layout arguments of each attention kind, in schema form; every op takes them after its
# tensors. Windows are two ints, not a tuple (schemas have no tuple arguments).
_VARLEN = (
    "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
    "float? softmax_scale, bool causal, SymInt window_left, SymInt window_right, float softcap, "
    "Tensor? seqused_q, Tensor? seqused_k, SymInt[]? cu_seqlens_q_host, "
    "SymInt[]? cu_seqlens_k_host, SymInt? total_q, SymInt? total_k"
)
_TREE = (
    "Tensor cu_seqlens, SymInt max_seqlen, Tensor subtree_end, Tensor? positions, "
    "float? softmax_scale, SymInt window_left, float softcap, Tensor? seqused, "
    "SymInt[]? cu_seqlens_host, SymInt? total, Tensor? query_rows=None"
)
_FORWARD = "(Tensor q, Tensor k, Tensor v, {}) -> (Tensor, Tensor)"
_BACKWARD = (
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {}) "
    "-> (Tensor, Tensor, Tensor)"
)


def _names(schema):
    return tuple(arg.split()[-1].split("=")[0] for arg in schema.split(", "))


def _varlen_layout(q, layout):
    cu_q, cu_k, max_q, max_k, scale, causal, left, right, softcap, *rest = layout
    return _AttentionLayout(
        TORCH, q, cu_q, cu_k, max_q, max_k, scale, causal, (left, right), softcap, *rest
    )


def _tree_layout(q, layout):
    return _TreeLayout(TORCH, q, dict(zip(_names(_TREE), layout)))


def _define(kind, layout_schema, make_layout):
    """The forward and backward ops of one attention kind, with fakes and autograd."""
    names = _names(layout_schema)

    def check(op, q, layout, **tensors):
        # q floating (the C++ then checks k, v and the rest against it), every tensor of a dtype
        # DLPack carries.
        check_dtypes(op, floats=("q",), q=q, **tensors)
        check_dtypes(op, **{n: t for n, t in zip(names, layout) if torch.is_tensor(t)})

    def forward(q, k, v, *layout):
        check("VarlenAttentionForward", q, layout, k=k, v=v)
        return _forward(TORCH, q, k, v, make_layout(q, layout))

    def forward_fake(q, k, v, *layout):
        check("VarlenAttentionForward", q, layout, k=k, v=v)
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=acc_dtype(q))
        return q.new_empty(tuple(q.shape)), lse

    def backward(dout, q, k, v, out, lse, *layout):
        check("VarlenAttentionBackward", q, layout, dout=dout, k=k, v=v, out=out, lse=lse)
        return _backward(TORCH, dout, q, k, v, out, lse, make_layout(q, layout))

    def backward_fake(dout, q, k, v, out, lse, *layout):
        check("VarlenAttentionBackward", q, layout, dout=dout, k=k, v=v, out=out, lse=lse)
        return tuple(x.new_empty(tuple(x.shape)) for x in (q, k, v))

    forward_op = torch.library.custom_op(
        f"packsched::{kind}_forward",
        forward,
        mutates_args=(),
        schema=_FORWARD.format(layout_schema),
    )
    backward_op = torch.library.custom_op(
        f"packsched::{kind}_backward",
        backward,
        mutates_args=(),
        schema=_BACKWARD.format(layout_schema),
    )
    forward_op.register_fake(forward_fake)
    backward_op.register_fake(backward_fake)

    def setup_context(ctx, inputs, output):
        q, k, v, *layout = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        # Tensors go through save_for_backward (None where an optional one is absent), the rest
        # (ints, floats, host offsets) on ctx.
        slots = [i for i, a in enumerate(layout) if a is None or torch.is_tensor(a)]
        ctx.save_for_backward(q, k, v, out, lse, *(layout[i] for i in slots))
        ctx.slots = slots
        ctx.layout = [None if i in slots else a for i, a in enumerate(layout)]

    def grad(ctx, dout, _dlse):
        q, k, v, out, lse, *saved = ctx.saved_tensors
        layout = list(ctx.layout)
        for i, t in zip(ctx.slots, saved):
            layout[i] = t
        dq, dk, dv = backward_op(dout, q, k, v, out, lse, *layout)
        return (dq, dk, dv) + (None,) * len(layout)

    return differentiable(forward_op, grad, setup_context), backward_op


_varlen_forward, _varlen_backward = _define("varlen_attention", _VARLEN, _varlen_layout)
_tree_forward, _ = _define("tree_attention", _TREE, _tree_layout)


def _varlen_args(
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
):
    """The public functions' layout arguments (_attention._LAYOUT_PARAMETERS) in schema form."""
    left, right = window_size
    cu_q, cu_k = tensor(cu_seqlens_q), tensor(cu_seqlens_k)
    return (
        cu_q,
        cu_k,
        integer(max_seqlen_q),
        integer(max_seqlen_k),
        None if softmax_scale is None else float(softmax_scale),
        bool(causal),
        integer(left),
        integer(right),
        float(softcap),
        tensor(seqused_q),
        tensor(seqused_k),
        host(cu_q, cu_seqlens_q_host, "cu_seqlens_q"),
        host(cu_k, cu_seqlens_k_host, "cu_seqlens_k"),
        optional_index(total_q, "total_q"),
        optional_index(total_k, "total_k"),
    )


def _detached(*tensors):
    return tuple(None if t is None else t.detach() for t in tensors)


def varlen_attention(q, k, v, layout, grad):
    """(out, lse) of the public call with q a torch tensor; layout: the values of
    _attention._LAYOUT_PARAMETERS. grad: differentiable in q, k and v (varlen_attention), else
    plain tensors (varlen_attention_forward)."""
    q, k, v = tensor(q), tensor(k), tensor(v)
    if not grad:
        q, k, v = _detached(q, k, v)
    return _varlen_forward(q, k, v, *_varlen_args(*layout))


def varlen_attention_backward(dout, q, k, v, out, lse, layout):
    tensors = _detached(*(tensor(x) for x in (dout, q, k, v, out, lse)))
    return _varlen_backward(*tensors, *_varlen_args(*layout))


def tree_attention(q, k, v, params):
    """(out, lse) of tree_attention with q a torch tensor; params: its arguments by name."""
    cu = tensor(params["cu_seqlens"])
    window_left = params["window_left"]
    softmax_scale = params["softmax_scale"]
    return _tree_forward(
        tensor(q),
        tensor(k),
        tensor(v),
        cu,
        integer(params["max_seqlen"]),
        tensor(params["subtree_end"]),
        tensor(params["positions"]),
        None if softmax_scale is None else float(softmax_scale),
        integer(window_left),
        float(params["softcap"]),
        tensor(params["seqused"]),
        host(cu, params["cu_seqlens_host"]),
        optional_index(params["total"], "total"),
        tensor(params.get("query_rows")),
    )
