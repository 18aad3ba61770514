"""torch.autograd.Functions of the recurrent kernels (packsched._recurrent), each one C++
forward and one C++ backward call (CPU tensors; CUDA tensors on torch's current stream where the
CUDA backend is built). The backward recomputes what it needs from the inputs (no state is saved
between the calls)."""

import numpy as np
import torch

from . import _kernels

_FLOATS = (torch.float32, torch.float64)


def _prev(prev_row, like):
    rows = like.shape[0]
    prev = torch.as_tensor(np.asarray(prev_row) if not torch.is_tensor(prev_row) else prev_row)
    prev = prev.to(device=like.device, dtype=torch.int32).contiguous()
    if prev.shape != (rows,):
        raise ValueError(f"prev_row must be [T] with T = {rows}, got {tuple(prev.shape)}")
    return prev


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.device.type == "cuda" else 0


def _check(name, t, dtype):
    if t.dtype not in _FLOATS or t.dtype != dtype:
        raise ValueError(f"{name} must be float32 or float64 like the first input, got {t.dtype}")
    return t.detach().contiguous()


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, prev, silu):
        x_, w_ = _check("x", x, x.dtype), _check("weight", weight, x.dtype)
        b_ = None if bias is None else _check("bias", bias, x.dtype)
        out = torch.empty_like(x_)
        _kernels.causal_conv1d_forward(x_, w_, b_, prev, silu, out, _stream(x_))
        ctx.save_for_backward(x_, w_, prev, *(() if b_ is None else (b_,)))
        ctx.silu = silu
        return out

    @staticmethod
    def backward(ctx, d_out):
        x, w, prev, *b = ctx.saved_tensors
        b = b[0] if b else None
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        db = None if b is None else torch.empty_like(b)
        _kernels.causal_conv1d_backward(
            x, w, b, prev, ctx.silu, d_out.contiguous(), dx, dw, db, _stream(x)
        )
        return dx, dw, db, None, None


class _Recurrence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, prev):
        dt = q.dtype
        q_, k_, v_, g_ = (_check(n, t, dt) for n, t in (("q", q), ("k", k), ("v", v), ("g", g)))
        b_ = None if beta is None else _check("beta", beta, dt)
        out = torch.empty(v_.shape, dtype=dt, device=v_.device)
        _kernels.gated_recurrence_forward(q_, k_, v_, g_, b_, prev, out, _stream(q_))
        ctx.save_for_backward(q_, k_, v_, g_, prev, *(() if b_ is None else (b_,)))
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, g, prev, *b = ctx.saved_tensors
        b = b[0] if b else None
        dq, dk, dv, dg = (torch.empty_like(t) for t in (q, k, v, g))
        db = None if b is None else torch.empty_like(b)
        _kernels.gated_recurrence_backward(
            q, k, v, g, b, prev, d_out.contiguous(), dq, dk, dv, dg, db, _stream(q)
        )
        return dq, dk, dv, dg, db, None


def causal_conv1d(x, weight, bias, prev_row, silu):
    return _Conv.apply(x, weight, bias, _prev(prev_row, x), bool(silu))


def gated_recurrence(q, k, v, g, beta, prev_row):
    return _Recurrence.apply(q, k, v, g, beta, _prev(prev_row, q))
