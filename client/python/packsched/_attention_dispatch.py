"""The torch path of varlen_attention and tree_attention: describe the call, choose its backend
(packsched._attention_backends) and run it: packsched's custom ops, or torch's varlen_attn,
flash_attn_varlen_func, or FlexAttention with a block mask built from the layout. Imported with
the first torch call, like _torch_ops.

Every backend computes packsched's contract (docs/design.md, "Kernel contracts", "Mask rule"):
out [tq, H, D] in q's dtype, and where a backend gives it, lse [H, tq] (natural log; +inf for a
row that sees no key). FlexAttention's block mask is kept for the last few layouts (the same
offset tensors, unchanged since), so the layers of one micro-batch build it once.
"""

import warnings

import torch

from . import _attention_backends as backends
from ._arrays import _torch_ops

_MASK_CACHE_SIZE = 4
_mask_cache = []  # [(tensors, versions, scalars, block_mask)], most recent last
_compiled = {}


def _device_kind(device):
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda:sm_{major}{minor}"
    return device.type


def _dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _unbounded(side, max_seqlen):
    """FlashAttention's varlen rule: a window side < 0 or >= max_seqlen_k is unbounded (-1)."""
    side = int(side)
    return -1 if side < 0 or side >= max_seqlen else side


def _host_list(x):
    return None if x is None else [int(v) for v in x]


def _has_tail(total, host, rows):
    if total is None:
        return False
    return host is None or int(total) > host[-1] or rows > host[-1]


def describe_varlen(q, k, layout, need_lse):
    """The Call of a varlen_attention call; layout: _attention._LAYOUT_PARAMETERS' values."""
    cu_q, cu_k, max_q, max_k, _scale, causal, window, softcap, used_q, used_k = layout[:10]
    host_q, host_k, total_q, total_k = layout[10:]
    left, right = (_unbounded(side, max_k) for side in window)
    mask = "window" if left >= 0 or (right >= 0 and not causal) else "causal" if causal else "full"
    same_offsets = cu_q is cu_k or (host_q is not None and _host_list(host_q) == _host_list(host_k))
    return backends.Call(
        device=_device_kind(q.device),
        dtype=_dtype_name(q.dtype),
        head_dim=int(q.shape[-1]),
        mask=mask,
        tokens=int(q.shape[0]),
        softcap=float(softcap) != 0.0,
        seqused=used_q is not None or used_k is not None,
        tail=_has_tail(total_q, _host_list(host_q), q.shape[0])
        or _has_tail(total_k, _host_list(host_k), k.shape[0]),
        cross=not same_offsets
        or used_q is not used_k
        or int(max_q) != int(max_k)
        or q.shape[0] != k.shape[0],
        grad=_needs_grad(q, k),
        lse=need_lse,
    )


def describe_tree(q, k, v, params, need_lse):
    host = _host_list(params["cu_seqlens_host"])
    return backends.Call(
        device=_device_kind(q.device),
        dtype=_dtype_name(q.dtype),
        head_dim=int(q.shape[-1]),
        mask="tree",
        tokens=int(q.shape[0]),
        softcap=float(params["softcap"]) != 0.0,
        seqused=params["seqused"] is not None,
        tail=_has_tail(params["total"], host, q.shape[0]),
        grad=_needs_grad(q, k, v),
        lse=need_lse,
    )


def _choose(describe, backend):
    """The backend's name; describe() gives the Call. Under torch.compile tracing the table and
    the environment stay outside the graph: the argument's backend, else packsched."""
    if torch.compiler.is_compiling():
        return "packsched" if backend in (None, backends.AUTO) else backend
    call = describe()
    name, why = backends.choose(call, backend)
    backends.log_choice(call, name, why)
    return name


def varlen(q, k, v, layout, backend, need_lse):
    """(out, lse or None) of varlen_attention with torch tensors, on the chosen backend."""
    name = _choose(lambda: describe_varlen(q, k, layout, need_lse), backend)
    if name == "packsched":
        return _torch_ops().varlen_attention(q, k, v, layout, grad=True)
    cu_q, cu_k, max_q, max_k, scale, causal, window, softcap = layout[:8]
    device = q.device
    cu_q, cu_k = (torch.as_tensor(c, dtype=torch.int32, device=device) for c in (cu_q, cu_k))
    left, right = (_unbounded(side, max_k) for side in window)
    if name == "varlen_attn":
        from torch.nn.attention.varlen import varlen_attn

        out = varlen_attn(
            q,
            k,
            v,
            cu_q,
            cu_k,
            int(max_q),
            int(max_k),
            scale=scale,
            window_size=(left, 0) if causal else (left, right),
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return out, None
    if name == "flash_attn":
        from flash_attn import flash_attn_varlen_func

        out = flash_attn_varlen_func(
            q,
            k,
            v,
            cu_q,
            cu_k,
            int(max_q),
            int(max_k),
            dropout_p=0.0,
            softmax_scale=scale,
            causal=bool(causal),
            window_size=(left, right),
            softcap=float(softcap),
        )
        return out, None
    used = layout[8]

    def make_mask():
        seq = _rows(cu_q, None if used is None else torch.as_tensor(used, device=device), rows)
        return _flat_mask(seq, bool(causal), left, right)

    rows = q.shape[0]
    sources = (layout[0], used)
    built = _cached_block_mask(
        sources, ("flat", bool(causal), left, right), make_mask, rows, device
    )
    return _flex(q, k, v, scale, softcap, built)


def tree(q, k, v, params, backend, need_lse):
    """(out, lse) of tree_attention with torch tensors, on the chosen backend."""
    name = _choose(lambda: describe_tree(q, k, v, params, need_lse), backend)
    if name == "packsched":
        return _torch_ops().tree_attention(q, k, v, params)
    device, rows = q.device, q.shape[0]
    used, positions = params["seqused"], params["positions"]
    window = _unbounded(params["window_left"], params["max_seqlen"])

    def make_mask():
        cu = torch.as_tensor(params["cu_seqlens"], dtype=torch.int32, device=device)
        seq = _rows(cu, None if used is None else torch.as_tensor(used, device=device), rows)
        subtree_end = torch.as_tensor(params["subtree_end"], device=device).to(torch.int64)
        depths = None if positions is None else torch.as_tensor(positions, device=device)
        return _tree_mask(seq, subtree_end, depths, window)

    sources = (params["cu_seqlens"], params["subtree_end"], positions, used)
    built = _cached_block_mask(sources, ("tree", window), make_mask, rows, device)
    return _flex(q, k, v, params["softmax_scale"], params["softcap"], built)


def _rows(cu, seqused, total):
    """Per packed row: its sequence (-1 for pad slots and the tail) as int64 [total]."""
    row = torch.arange(total, device=cu.device)
    bounds = cu.to(torch.int64)
    count = bounds.numel() - 1
    seq = torch.searchsorted(bounds[1:], row, right=True)
    inside = seq < count
    if seqused is not None and count > 0:
        start = bounds[seq.clamp(max=count - 1)]
        inside &= row - start < seqused.to(torch.int64)[seq.clamp(max=count - 1)]
    return torch.where(inside, seq, -1)


def _flat_mask(seq, causal, left, right):
    """FlexAttention's mask_mod of a flat layout (self-attention: rows index q and k alike)."""

    def mask(b, h, qi, ki):
        ok = (seq[qi] == seq[ki]) & (seq[ki] >= 0)
        if causal:
            ok = ok & (ki <= qi)
        elif right >= 0:
            ok = ok & (ki - qi <= right)
        if left >= 0:
            ok = ok & (qi - ki <= left)
        return ok

    return mask


def _tree_mask(seq, subtree_end, positions, window):
    """FlexAttention's mask_mod of the tree mask rule: j <= i < subtree_end[j], same piece, real
    rows, and with a left window depth(i) - depth(j) <= window."""

    def mask(b, h, qi, ki):
        ok = (seq[qi] == seq[ki]) & (seq[ki] >= 0) & (ki <= qi) & (qi < subtree_end[ki])
        if window >= 0:
            ok = ok & (positions[qi] - positions[ki] <= window)
        return ok

    return mask


def block_mask(mask, rows, device):
    """FlexAttention's BlockMask of `mask` over rows x rows (compiled on CUDA: no rows² tensor)."""
    from torch.nn.attention.flex_attention import create_block_mask

    compiled = device.type == "cuda"
    return create_block_mask(mask, None, None, rows, rows, device=device, _compile=compiled)


def _cached_block_mask(sources, scalars, make_mask, rows, device):
    """The block mask of make_mask() over rows, reused while the caller's layout tensors
    (sources) are the same objects, unwritten since, with the same scalars. They are held here,
    so none is freed and replaced at the same address; an in-place write bumps a version."""
    versions = tuple(None if t is None else t._version for t in sources)
    scalars = (scalars, rows, str(device))
    for held, held_versions, held_scalars, built in _mask_cache:
        same = all(a is b for a, b in zip(held, sources))
        if same and held_versions == versions and held_scalars == scalars:
            return built
    built = block_mask(make_mask(), rows, device)
    _mask_cache.append((sources, versions, scalars, built))
    del _mask_cache[:-_MASK_CACHE_SIZE]
    return built


def flex_function(device):
    """flex_attention, compiled once per process on CUDA (its eager path is the unfused math)."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if "flex" not in _compiled:
        _compiled["flex"] = torch.compile(flex_attention, dynamic=False)
    return _compiled["flex"]


def _flex(q, k, v, scale, softcap, built):
    """(out [T, H, D], lse [H, T]) by FlexAttention; a row that sees no key: out 0, lse +inf."""
    from torch.nn.attention import flex_attention as flex

    score_mod = None
    if softcap:
        cap = float(softcap)

        def score_mod(score, b, h, qi, ki):
            return cap * torch.tanh(score / cap)

    lse_args = (
        {"return_aux": flex.AuxRequest(lse=True)}
        if hasattr(flex, "AuxRequest")
        else {"return_lse": True}
    )
    with warnings.catch_warnings():
        # Off CUDA the eager FlexAttention is the unfused math, which is what the CPU can run.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out, aux = flex_function(q.device)(
            *(x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)),
            score_mod=score_mod,
            block_mask=built,
            scale=None if scale is None else float(scale),
            enable_gqa=q.shape[1] != k.shape[1],
            **lse_args,
        )
    lse = aux.lse if hasattr(aux, "lse") else aux
    out = out[0].transpose(0, 1)
    lse = lse[0].detach().to(torch.float64 if q.dtype == torch.float64 else torch.float32)
    seen = torch.isfinite(lse)
    out = torch.where(seen.transpose(0, 1)[..., None], out, torch.zeros((), dtype=out.dtype))
    return out.contiguous(), torch.where(seen, lse, torch.full((), float("inf"), dtype=lse.dtype))
