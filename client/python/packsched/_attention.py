"""Varlen attention of packsched.kernels: forward and backward (FlashAttention's varlen
interface). Torch tensors go through the custom ops of packsched._ops_attention (autograd
included), whose implementations are _forward and _backward here."""

from . import _kernels
from ._arrays import _Torch, _host, _is_float64, _lib_of, _rows, _same_lib, _torch_ops


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


_LAYOUT_PARAMETERS = (
    "cu_seqlens_q",
    "cu_seqlens_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "softmax_scale",
    "causal",
    "window_size",
    "softcap",
    "seqused_q",
    "seqused_k",
    "cu_seqlens_q_host",
    "cu_seqlens_k_host",
    "total_q",
    "total_k",
)


def _layout_of(params):
    """(lib, q, layout) of a public call; params: its locals(), q and the _LAYOUT_PARAMETERS."""
    lib, q = _lib_of(params["q"])
    return lib, q, _AttentionLayout(lib, q, *_layout_values(params))


def _layout_values(params):
    return tuple(params[name] for name in _LAYOUT_PARAMETERS)


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
    slot) gets out = 0 and lse = +inf. Torch tensors: the op packsched::varlen_attention_forward,
    outputs outside autograd.
    """
    if isinstance(_lib_of(q)[0], _Torch):
        layout = (
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
        )  # _LAYOUT_PARAMETERS' order, spelled out: dynamo before torch 2.5 cannot trace locals()
        return _torch_ops().varlen_attention(q, k, v, layout, grad=False)
    lib, q, layout = _layout_of(locals())
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
    0. Deterministic (bitwise reproducible). Torch tensors: the op
    packsched::varlen_attention_backward."""
    if isinstance(_lib_of(q)[0], _Torch):
        layout = (
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
        )  # _LAYOUT_PARAMETERS' order, spelled out: dynamo before torch 2.5 cannot trace locals()
        return _torch_ops().varlen_attention_backward(dout, q, k, v, out, lse, layout)
    lib, q, layout = _layout_of(locals())
    return _backward(lib, dout, q, k, v, out, lse, layout)


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
    backend=None,
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
    total_q/total_k (the rows of q resp. k when they end with a tail past the last offset),
    backend (torch tensors: which implementation runs the call, "auto" by default: the
    environment variable PACKSCHED_ATTENTION_BACKEND, else the shipped table of measured
    backends; "packsched", "varlen_attn", "flash_attn" or "flex" forces one, ValueError if it
    cannot run the call; packsched._attention_backends has the rules).

    For torch tensors this is the custom op packsched::varlen_attention_forward, differentiable
    in q, k and v (through packsched::varlen_attention_backward) and traced by torch.compile.
    Numpy (and other host DLPack) inputs run the forward only. See varlen_attention_forward for
    shapes and semantics.
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
    if isinstance(_lib_of(q)[0], _Torch):
        layout = (
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
        )  # _LAYOUT_PARAMETERS' order, spelled out: dynamo before torch 2.5 cannot trace locals()
        from . import _attention_dispatch

        need_lse = bool(return_lse or return_attn_probs)
        out, lse = _attention_dispatch.varlen(q, k, v, layout, backend, need_lse)
    else:
        lib, q, layout = _layout_of(locals())
        out, lse = _forward(lib, q, k, v, layout)
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_lse else out
