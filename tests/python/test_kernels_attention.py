"""packsched.kernels varlen attention: the autograd Function (gradcheck in float64), the numpy
forward/backward against a per-sequence torch reference, the aligned layout, argument errors, and
the equivalence a user relies on: a transformer block on a padded batch with a mask and on the
packed batch gives the same per-token outputs and gradients."""

import math
import sys

import numpy as np
import pytest
import torch

from packsched import kernels as k

from conftest import cu_of


def reference(
    q,
    k_,
    v,
    cu_q,
    cu_k,
    causal=False,
    window=(-1, -1),
    softcap=0.0,
    scale=None,
    seqused_q=None,
    seqused_k=None,
):
    """Naive float64 attention per sequence from the definition (out, lse), with torch ops."""
    q, k_, v = (torch.as_tensor(np.asarray(x, dtype=np.float64)) for x in (q, k_, v))
    tq, heads, dim = q.shape
    group = heads // k_.shape[1]
    scale = dim**-0.5 if scale is None else scale
    out = torch.zeros_like(q)
    lse = torch.full((heads, tq), math.inf, dtype=torch.float64)
    for b in range(len(cu_q) - 1):
        sq = int(cu_q[b + 1] - cu_q[b]) if seqused_q is None else int(seqused_q[b])
        sk = int(cu_k[b + 1] - cu_k[b]) if seqused_k is None else int(seqused_k[b])
        if sq == 0:
            continue
        qs = q[cu_q[b] : cu_q[b] + sq]
        ks = k_[cu_k[b] : cu_k[b] + sk].repeat_interleave(group, dim=1)
        vs = v[cu_k[b] : cu_k[b] + sk].repeat_interleave(group, dim=1)
        s = torch.einsum("ihd,jhd->hij", qs, ks) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        diag = i + sk - sq
        visible = torch.ones(sq, sk, dtype=torch.bool)
        if causal:
            visible &= j <= diag
        if window[0] >= 0:
            visible &= j >= diag - window[0]
        if window[1] >= 0:
            visible &= j <= diag + window[1]
        s = s.masked_fill(~visible, -math.inf)
        row_lse = torch.logsumexp(s, dim=-1)  # -inf for a row that sees nothing
        p = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)
        out[cu_q[b] : cu_q[b] + sq] = torch.einsum("hij,jhd->ihd", p, vs)
        lse[:, cu_q[b] : cu_q[b] + sq] = torch.where(torch.isinf(row_lse), math.inf, row_lse)
    return out, lse


def random_problem(lengths_q, lengths_k, heads=4, kv_heads=2, dim=16, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    cu_q, cu_k = cu_of(lengths_q), cu_of(lengths_k)
    q = rng.standard_normal((cu_q[-1], heads, dim)).astype(dtype)
    k_ = rng.standard_normal((cu_k[-1], kv_heads, dim)).astype(dtype)
    v = rng.standard_normal((cu_k[-1], kv_heads, dim)).astype(dtype)
    return q, k_, v, cu_q, cu_k


LENGTHS = [([5, 0, 17, 1], [9, 3, 17, 0]), ([97], [128]), ([0], [0])]


@pytest.mark.parametrize("lengths_q,lengths_k", LENGTHS)
@pytest.mark.parametrize(
    "causal,window,softcap",
    [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (True, (4, -1), 0.0), (False, (3, 2), 1.5)],
)
def test_numpy_forward_matches_reference(lengths_q, lengths_k, causal, window, softcap):
    q, k_, v, cu_q, cu_k = random_problem(lengths_q, lengths_k)
    out, lse = k.varlen_attention_forward(
        q,
        k_,
        v,
        cu_q,
        cu_k,
        max(lengths_q),
        max(lengths_k),
        causal=causal,
        window_size=window,
        softcap=softcap,
    )
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and lse.dtype == np.float32
    want_out, want_lse = reference(q, k_, v, cu_q, cu_k, causal, window, softcap)
    np.testing.assert_allclose(out, want_out.numpy(), atol=2e-5)
    assert np.array_equal(np.isinf(lse), np.isinf(want_lse.numpy()))
    finite = np.isfinite(lse)
    np.testing.assert_allclose(lse[finite], want_lse.numpy()[finite], atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_torch_dtypes_follow_the_input(dtype):
    q, k_, v, cu_q, cu_k = random_problem([33, 7], [20, 7], dtype=np.float32)
    tq, tk, tv = (torch.from_numpy(x).to(dtype) for x in (q, k_, v))
    out, lse = k.varlen_attention(
        tq,
        tk,
        tv,
        torch.from_numpy(cu_q),
        torch.from_numpy(cu_k),
        33,
        20,
        causal=True,
        return_lse=True,
    )
    assert out.dtype == dtype and lse.dtype == torch.float32
    want, _ = reference(tq.double(), tk.double(), tv.double(), cu_q, cu_k, causal=True)
    tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 2e-5}[dtype]
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=0)


@pytest.mark.parametrize(
    "causal,window,softcap,heads,kv_heads",
    [
        (False, (-1, -1), 0.0, 2, 2),
        (True, (-1, -1), 0.0, 4, 2),
        (True, (2, -1), 2.0, 2, 1),
        (False, (1, 1), 0.0, 3, 1),
    ],
)
def test_gradcheck_float64(causal, window, softcap, heads, kv_heads):
    q, k_, v, cu_q, cu_k = random_problem([4, 0, 6], [5, 2, 3], heads, kv_heads, 8, np.float64)
    args = [torch.from_numpy(x).requires_grad_() for x in (q, k_, v)]
    cu_q, cu_k = torch.from_numpy(cu_q), torch.from_numpy(cu_k)

    def f(q, k_, v):
        return k.varlen_attention(
            q, k_, v, cu_q, cu_k, 6, 5, 0.0, 0.7, causal, window, softcap=softcap
        )

    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7)


def test_gradcheck_with_padded_offsets_and_seqused():
    q, k_, v, cu_q, cu_k = random_problem([6, 3], [5, 4], 2, 1, 8, np.float64, seed=3)
    used_q = torch.tensor([4, 3], dtype=torch.int32)
    used_k = torch.tensor([5, 2], dtype=torch.int32)
    args = [torch.from_numpy(x).requires_grad_() for x in (q, k_, v)]
    cu_q, cu_k = torch.from_numpy(cu_q), torch.from_numpy(cu_k)

    def f(q, k_, v):
        return k.varlen_attention(
            q, k_, v, cu_q, cu_k, 6, 5, causal=True, seqused_q=used_q, seqused_k=used_k
        )

    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7)
    out = f(*args)
    assert torch.all(out[4:6] == 0)  # pad slots of sequence 0


def test_numpy_backward_matches_autograd_of_the_reference():
    q, k_, v, cu_q, cu_k = random_problem([7, 12], [12, 5], 4, 1, 16, np.float64, seed=5)
    rng = np.random.default_rng(9)
    dout = rng.standard_normal(q.shape)
    out, lse = k.varlen_attention_forward(q, k_, v, cu_q, cu_k, 12, 12, causal=True)
    dq, dk, dv = k.varlen_attention_backward(
        dout, q, k_, v, out, lse, cu_q, cu_k, 12, 12, causal=True
    )
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k_, v))
    want = differentiable_reference(tq, tk, tv, cu_q, cu_k)
    want.backward(torch.from_numpy(dout))
    np.testing.assert_allclose(out, want.detach().numpy(), atol=1e-12)
    for got, ref in ((dq, tq.grad), (dk, tk.grad), (dv, tv.grad)):
        np.testing.assert_allclose(got, ref.numpy(), atol=1e-12)


def differentiable_reference(q, k_, v, cu_q, cu_k):
    """Causal attention per sequence built with differentiable torch ops only."""
    group = q.shape[1] // k_.shape[1]
    outs = []
    for b in range(len(cu_q) - 1):
        qs, ks, vs = q[cu_q[b] : cu_q[b + 1]], k_[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
        ks, vs = ks.repeat_interleave(group, dim=1), vs.repeat_interleave(group, dim=1)
        sq, sk = qs.shape[0], ks.shape[0]
        s = torch.einsum("ihd,jhd->hij", qs, ks) * q.shape[2] ** -0.5
        visible = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
        p = torch.softmax(s.masked_fill(~visible, -math.inf), dim=-1).nan_to_num(0.0)
        outs.append(torch.einsum("hij,jhd->ihd", p, vs))
    return torch.cat(outs)


def test_aligned_layout_equals_packed_layout():
    lengths = [5, 0, 17, 9]
    q, k_, v, cu, _ = random_problem(lengths, lengths, seed=4)
    out, lse = k.varlen_attention_forward(q, k_, v, cu, cu, 17, 17, causal=True)
    qa, cu_a, used = k.pack_aligned(q, cu, 8)
    ka, _, _ = k.pack_aligned(k_, cu, 8, pad_value=float("nan"))
    va, _, _ = k.pack_aligned(v, cu, 8, pad_value=float("nan"))
    out_a, lse_a = k.varlen_attention_forward(
        qa, ka, va, cu_a, cu_a, 24, 24, causal=True, seqused_q=used, seqused_k=used
    )
    np.testing.assert_array_equal(k.unpack_aligned(out_a, cu, cu_a), out)
    for b, n in enumerate(lengths):
        assert np.all(np.isinf(lse_a[:, cu_a[b] + n : cu_a[b + 1]]))
        np.testing.assert_array_equal(lse_a[:, cu_a[b] : cu_a[b] + n], lse[:, cu[b] : cu[b] + n])


def test_errors_name_the_argument():
    q, k_, v, cu_q, cu_k = random_problem([3], [3])
    with pytest.raises(ValueError, match="dropout_p must be 0"):
        k.varlen_attention(q, k_, v, cu_q, cu_k, 3, 3, 0.1)
    with pytest.raises(ValueError, match="max_seqlen_q = 2 is less than"):
        k.varlen_attention_forward(q, k_, v, cu_q, cu_k, 2, 3)
    with pytest.raises(ValueError, match="H = 4 must be a positive multiple"):
        k.varlen_attention_forward(
            q, k_[:, :1].repeat(3, axis=1), v[:, :1].repeat(3, axis=1), cu_q, cu_k, 3, 3
        )
    with pytest.raises(ValueError, match="window"):
        k.varlen_attention_forward(q, k_, v, cu_q, cu_k, 3, 3, window_size=(-5, 0))


def test_signature_matches_flash_attn_varlen_func():
    """flash_attn_varlen_func's sixteen parameters (FlashAttention 2.6+), in order and with its
    defaults, so positional calls carry over; our extras are keyword-only."""
    import inspect

    params = list(inspect.signature(k.varlen_attention).parameters.values())
    assert [(p.name, p.default) for p in params[7:16]] == [
        ("dropout_p", 0.0),
        ("softmax_scale", None),
        ("causal", False),
        ("window_size", (-1, -1)),
        ("softcap", 0.0),
        ("alibi_slopes", None),
        ("deterministic", False),
        ("return_attn_probs", False),
        ("block_table", None),
    ]
    assert [p.name for p in params[:7]] == [
        "q",
        "k",
        "v",
        "cu_seqlens_q",
        "cu_seqlens_k",
        "max_seqlen_q",
        "max_seqlen_k",
    ]
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params[:16])
    assert all(p.kind == p.KEYWORD_ONLY for p in params[16:])
    assert [p.name for p in params[16:19]] == ["seqused_q", "seqused_k", "return_lse"]


def test_flash_attn_style_calls():
    """How HF transformers and verl call flash_attn_varlen_func: softcap positionally,
    deterministic=, alibi_slopes=None, return_attn_probs=."""
    q, k_, v, cu_q, cu_k = random_problem([5, 0, 17, 1], [9, 3, 17, 0], seed=6)
    args = [torch.from_numpy(x) for x in (q, k_, v, cu_q, cu_k)] + [17, 17]
    want, want_lse = reference(q, k_, v, cu_q, cu_k, True, (4, -1), 1.5, 0.3)
    out = k.varlen_attention(*args, 0.0, 0.3, True, (4, -1), 1.5, None, True, False)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)
    kw = dict(dropout_p=0.0, softmax_scale=0.3, causal=True, window_size=(4, -1), softcap=1.5)
    for deterministic in (False, True):
        assert torch.equal(k.varlen_attention(*args, deterministic=deterministic, **kw), out)
    got = k.varlen_attention(*args, return_attn_probs=True, alibi_slopes=None, **kw)
    assert isinstance(got, tuple) and len(got) == 3 and got[2] is None
    assert torch.equal(got[0], out)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isinf(got[1]), ~finite)
    torch.testing.assert_close(got[1].double()[finite], want_lse[finite], atol=2e-5, rtol=0)


def test_deterministic_backward_is_bitwise_repeatable():
    q, k_, v, cu_q, cu_k = random_problem([33, 7], [20, 7], seed=8)
    cu_q, cu_k = torch.from_numpy(cu_q), torch.from_numpy(cu_k)
    grads = []
    for _ in range(2):
        x = [torch.from_numpy(a).requires_grad_() for a in (q, k_, v)]
        k.varlen_attention(*x, cu_q, cu_k, 33, 20, causal=True, deterministic=True).sum().backward()
        grads.append([a.grad for a in x])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_unsupported_flash_attn_options_are_refused():
    q, k_, v, cu_q, cu_k = random_problem([3], [3])
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        k.varlen_attention(q, k_, v, cu_q, cu_k, 3, 3, alibi_slopes=np.ones(4, np.float32))
    with pytest.raises(NotImplementedError, match="block_table"):
        k.varlen_attention(q, k_, v, cu_q, cu_k, 3, 3, block_table=np.zeros((1, 1), np.int32))


def test_a_window_side_at_least_max_seqlen_k_is_unbounded():
    """FlashAttention's varlen rule, which matters for sq > sk: window (-1, 2) with
    max_seqlen_k = 2 lets query 0 of a 4-query, 2-key sequence see both keys; with a larger
    max_seqlen_k the window holds and query 0 sees key 0 alone (out = v_0)."""
    q, k_, v, cu_q, cu_k = random_problem(
        [4], [2], heads=2, kv_heads=1, dim=8, dtype=np.float64, seed=2
    )
    plain = k.varlen_attention_forward(q, k_, v, cu_q, cu_k, 4, 2)
    windowed = k.varlen_attention_forward(q, k_, v, cu_q, cu_k, 4, 2, window_size=(-1, 2))
    for a, b in zip(windowed, plain):
        np.testing.assert_array_equal(a, b)
    out, _ = k.varlen_attention_forward(q, k_, v, cu_q, cu_k, 4, 3, window_size=(-1, 2))
    np.testing.assert_array_equal(out[0], np.repeat(v[0], 2, axis=0))
    assert not np.array_equal(plain[0][0], out[0])


@pytest.mark.parametrize(
    "window",
    [(-1, sys.maxsize), (sys.maxsize, -1), (2**62, 2**62), (sys.maxsize - 1, sys.maxsize - 1)],
)
@pytest.mark.parametrize("max_seqlen_k", [4, sys.maxsize])
def test_windows_near_int64_max_are_unbounded(window, max_seqlen_k):
    """Such windows used to overflow and hide every key (lse = +inf, out = 0)."""
    q, k_, v, cu_q, cu_k = random_problem([4, 9], [4, 2], dtype=np.float64, seed=1)
    plain = k.varlen_attention_forward(q, k_, v, cu_q, cu_k, 9, 4)
    got = k.varlen_attention_forward(q, k_, v, cu_q, cu_k, 9, max_seqlen_k, window_size=window)
    for a, b in zip(got, plain):
        np.testing.assert_array_equal(a, b)


# ---- A small transformer block, padded with a mask vs packed ----

EMBED, HEADS, KV_HEADS, HEAD_DIM = 32, 4, 2, 8


def block_params(seed):
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(shape[0])

    return {
        "wq": w(EMBED, HEADS * HEAD_DIM),
        "wk": w(EMBED, KV_HEADS * HEAD_DIM),
        "wv": w(EMBED, KV_HEADS * HEAD_DIM),
        "wo": w(HEADS * HEAD_DIM, EMBED),
        "w1": w(EMBED, 4 * EMBED),
        "w2": w(4 * EMBED, EMBED),
    }


def mlp_and_residuals(x, attn, p):
    h = x + attn @ p["wo"]
    return h + torch.nn.functional.gelu(h @ p["w1"]) @ p["w2"]


def padded_block(x, mask, p):
    """x [B, S, E], mask [B, S] (right padded); attention with a causal + key-padding mask."""
    b, s, _ = x.shape
    q = (x @ p["wq"]).view(b, s, HEADS, HEAD_DIM)
    k_ = (x @ p["wk"]).view(b, s, KV_HEADS, HEAD_DIM).repeat_interleave(HEADS // KV_HEADS, 2)
    v = (x @ p["wv"]).view(b, s, KV_HEADS, HEAD_DIM).repeat_interleave(HEADS // KV_HEADS, 2)
    scores = torch.einsum("bihd,bjhd->bhij", q, k_) * HEAD_DIM**-0.5
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    allowed = causal[None, None] & mask[:, None, None, :]
    probs = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1).nan_to_num(0.0)
    attn = torch.einsum("bhij,bjhd->bihd", probs, v).reshape(b, s, HEADS * HEAD_DIM)
    return mlp_and_residuals(x, attn, p)


def packed_block(x, cu, max_len, p):
    """x [total, E] packed; the same block with varlen_attention."""
    t = x.shape[0]
    q = (x @ p["wq"]).view(t, HEADS, HEAD_DIM)
    k_ = (x @ p["wk"]).view(t, KV_HEADS, HEAD_DIM)
    v = (x @ p["wv"]).view(t, KV_HEADS, HEAD_DIM)
    attn = k.varlen_attention(q, k_, v, cu, cu, max_len, max_len, causal=True)
    return mlp_and_residuals(x, attn.reshape(t, HEADS * HEAD_DIM), p)


def test_transformer_block_padded_and_packed_agree():
    lengths = [7, 1, 0, 12, 4]
    seqlen = max(lengths) + 3
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    g = torch.Generator().manual_seed(0)
    x = torch.randn(len(lengths), seqlen, EMBED, generator=g, dtype=torch.float64)
    target = torch.randn(len(lengths), seqlen, EMBED, generator=g, dtype=torch.float64)

    p_pad = {n: w.clone().requires_grad_() for n, w in block_params(1).items()}
    x_pad = x.clone().requires_grad_()
    y_pad = padded_block(x_pad, mask, p_pad)
    (y_pad * target * mask[..., None]).sum().backward()

    p_pack = {n: w.clone().requires_grad_() for n, w in block_params(1).items()}
    x_packed, indices, cu, max_len, _ = k.unpad(x, mask)
    x_packed.requires_grad_()
    y_packed = packed_block(x_packed, cu, max_len, p_pack)
    target_packed, _, _, _, _ = k.unpad(target, mask)
    (y_packed * target_packed).sum().backward()

    # Per-token outputs and input gradients, scattered back to the padded layout.
    got = k.pad(y_packed.detach(), indices, *mask.shape)
    torch.testing.assert_close(got[mask], y_pad.detach()[mask], rtol=0, atol=1e-12)
    got_dx = k.pad(x_packed.grad, indices, *mask.shape)
    torch.testing.assert_close(got_dx[mask], x_pad.grad[mask], rtol=0, atol=1e-12)
    assert torch.all(x_pad.grad[~mask] == 0)
    for name in p_pad:
        torch.testing.assert_close(
            p_pack[name].grad, p_pad[name].grad, rtol=0, atol=1e-11, msg=name
        )


@pytest.mark.skipif(
    not torch.cuda.is_available() or not k.built_with_cuda(),
    reason="needs a CUDA device and a CUDA build",
)
def test_cuda_matches_cpu_forward_and_backward():
    q, k_, v, cu_q, cu_k = random_problem([97, 0, 40], [60, 13, 128], 4, 2, 64, np.float32)
    cpu = [torch.from_numpy(x).requires_grad_() for x in (q, k_, v)]
    gpu = [x.detach().cuda().requires_grad_() for x in cpu]
    args = (torch.from_numpy(cu_q), torch.from_numpy(cu_k), 97, 128, 0.0, None, True, (30, -1))
    out_cpu = k.varlen_attention(*cpu, *args, softcap=3.0)
    out_gpu = k.varlen_attention(*gpu, args[0].cuda(), args[1].cuda(), *args[2:], softcap=3.0)
    dout = torch.randn_like(out_cpu)
    out_cpu.backward(dout)
    out_gpu.backward(dout.cuda())
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=1e-4, rtol=0)
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, atol=1e-4, rtol=0)
