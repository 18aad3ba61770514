"""A tiny hybrid language model (Gated DeltaNet, Mamba-2 and full-attention layers interleaved, as
Qwen3-Next and Nemotron-H interleave them) run two ways: over packed or tree-packed rows with
packsched's kernels (``Packed``: causal_conv1d, gated_delta_rule, selective_scan over
``prev_row``; varlen or tree attention), and over a padded batch of whole sequences with the
per-sequence definitions of helpers/hybrid_reference.py and plain torch attention
(``Padded``). The layers are written once over any leading dimensions; only the ops differ.
Parameters come from ``seed`` alone, so every process builds the same model."""

import math

import torch
import torch.nn.functional as F

from hybrid_reference import conv_ref, gated_delta_ref, selective_scan_ref
from packsched import kernels

LAYERS = ("gdn", "attn", "mamba", "gdn", "attn")


def _rms(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class GatedDeltaNet(torch.nn.Module):
    """Qwen3-Next's linear attention: q, k, v through a causal conv (SiLU), L2-normalised q, k,
    decay g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), the gated delta rule, an
    RMSNorm gated by SiLU(z)."""

    def __init__(self, dim, heads=2, kd=4, vd=6, width=4):
        super().__init__()
        self.heads, self.kd, self.vd = heads, kd, vd
        self.conv_dim = heads * (2 * kd + vd)
        self.proj = torch.nn.Linear(dim, self.conv_dim + heads * vd + 2 * heads)
        self.conv = torch.nn.Parameter(torch.randn(self.conv_dim, width) * 0.5)
        self.A_log = torch.nn.Parameter(torch.rand(heads).log())
        self.dt_bias = torch.nn.Parameter(torch.randn(heads) * 0.1)
        self.norm = torch.nn.Parameter(1 + 0.1 * torch.randn(vd))
        self.out = torch.nn.Linear(heads * vd, dim)

    def forward(self, x, ops):
        h, kd, vd = self.heads, self.kd, self.vd
        qkv, z, a, b = self.proj(x).split([self.conv_dim, h * vd, h, h], dim=-1)
        qkv = ops.conv(qkv, self.conv, None)
        q, k, v = qkv.split([h * kd, h * kd, h * vd], dim=-1)
        lead = x.shape[:-1]
        q = F.normalize(q.reshape(*lead, h, kd), dim=-1) / math.sqrt(kd)
        k = F.normalize(k.reshape(*lead, h, kd), dim=-1)
        g = -self.A_log.exp() * F.softplus(a + self.dt_bias)
        o = ops.delta(q, k, v.reshape(*lead, h, vd), g, torch.sigmoid(b))
        o = _rms(o, self.norm) * F.silu(z.reshape(*lead, h, vd))
        return self.out(o.reshape(*lead, h * vd))


class Mamba2(torch.nn.Module):
    """Mamba-2's mixer: x, B, C through a causal conv with bias (SiLU), dt = softplus(dt +
    dt_bias), A = -exp(A_log), the selective scan with the D skip, RMSNorm of y SiLU(z)."""

    def __init__(self, dim, heads=4, hd=3, groups=2, state=5, width=4):
        super().__init__()
        self.heads, self.hd, self.groups, self.state = heads, hd, groups, state
        self.conv_dim = heads * hd + 2 * groups * state
        self.proj = torch.nn.Linear(dim, heads * hd + self.conv_dim + heads)
        self.conv = torch.nn.Parameter(torch.randn(self.conv_dim, width) * 0.5)
        self.conv_bias = torch.nn.Parameter(torch.randn(self.conv_dim) * 0.1)
        self.A_log = torch.nn.Parameter(torch.rand(heads).log())
        self.dt_bias = torch.nn.Parameter(torch.randn(heads) * 0.1)
        self.D = torch.nn.Parameter(torch.randn(heads))
        self.norm = torch.nn.Parameter(1 + 0.1 * torch.randn(heads * hd))
        self.out = torch.nn.Linear(heads * hd, dim)

    def forward(self, x, ops):
        h, p, gn = self.heads, self.hd, self.groups * self.state
        z, xbc, dt = self.proj(x).split([h * p, self.conv_dim, h], dim=-1)
        xbc = ops.conv(xbc, self.conv, self.conv_bias)
        xs, B, C = xbc.split([h * p, gn, gn], dim=-1)
        lead = x.shape[:-1]
        y = ops.scan(
            xs.reshape(*lead, h, p),
            F.softplus(dt + self.dt_bias),
            -self.A_log.exp(),
            B.reshape(*lead, self.groups, self.state),
            C.reshape(*lead, self.groups, self.state),
            self.D,
        )
        return self.out(_rms(y.reshape(*lead, h * p) * F.silu(z), self.norm))


class Attention(torch.nn.Module):
    def __init__(self, dim, heads=2, hd=8):
        super().__init__()
        self.heads, self.hd = heads, hd
        self.qkv = torch.nn.Linear(dim, 3 * heads * hd)
        self.out = torch.nn.Linear(heads * hd, dim)

    def forward(self, x, ops):
        lead = x.shape[:-1]
        q, k, v = (t.reshape(*lead, self.heads, self.hd) for t in self.qkv(x).chunk(3, dim=-1))
        return self.out(ops.attend(q, k, v).reshape(*lead, self.heads * self.hd))


class TinyHybridLM(torch.nn.Module):
    def __init__(self, vocab=61, dim=24, max_len=512, seed=0, dtype=torch.float64, sizes=None):
        """sizes: per layer kind ("gdn", "mamba", "attn"), keyword arguments of its mixer."""
        super().__init__()
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(max_len, dim)
        mixers = {"gdn": GatedDeltaNet, "mamba": Mamba2, "attn": Attention}
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(dim) for _ in LAYERS)
        sizes = sizes or {}
        self.mixers = torch.nn.ModuleList(
            mixers[kind](dim, **sizes.get(kind, {})) for kind in LAYERS
        )
        self.final = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)
        torch.random.set_rng_state(state)
        self.to(dtype)

    def forward(self, ids, positions, ops):
        """ids, positions [..., T] -> logits [..., T, vocab]; positions are depths in a tree."""
        x = self.embed(ids) + self.pos(positions)
        for norm, mixer in zip(self.norms, self.mixers):
            x = x + mixer(norm(x), ops)
        return self.head(self.final(x))


class Packed:
    """The ops over packed rows: recurrences over ``prev_row``; attention by the tree mask
    (``subtree_end``, int32 [T]) or, without it, varlen causal attention over ``cu`` (host
    offsets of the sequences)."""

    def __init__(self, prev_row, cu, subtree_end=None):
        self.prev, self.cu, self.subtree_end = prev_row, cu, subtree_end
        self.cu_t = torch.tensor(cu, dtype=torch.int32)
        self.max_len = max(b - a for a, b in zip(cu, cu[1:]))

    def conv(self, x, weight, bias):
        return kernels.causal_conv1d(x, weight, bias, self.prev, silu=True)

    def delta(self, q, k, v, g, beta):
        return kernels.gated_delta_rule(q, k, v, g, beta, self.prev)

    def scan(self, x, dt, A, B, C, D):
        return kernels.selective_scan(x, dt, A, B, C, D, self.prev)

    def attend(self, q, k, v):
        if self.subtree_end is None:
            return kernels.varlen_attention(
                q, k, v, self.cu_t, self.cu_t, self.max_len, self.max_len, causal=True,
                cu_seqlens_q_host=self.cu, cu_seqlens_k_host=self.cu,
            )  # fmt: skip
        return kernels.tree_attention(
            q, k, v, self.cu_t, self.max_len, self.subtree_end, cu_seqlens_host=self.cu
        )


def _per_step(x):
    """[B, S, X, ...] -> [S, B * X, ...]: batch entries become independent heads / channels."""
    return x.transpose(0, 1).reshape(x.shape[1], x.shape[0] * x.shape[2], *x.shape[3:])


def _back(y, batch):
    return y.reshape(y.shape[0], batch, -1, *y.shape[2:]).transpose(0, 1)


class Padded:
    """The ops over a right-padded batch [B, S] of whole sequences (``mask`` True on tokens): the
    definitions of helpers/hybrid_reference.py and plain softmax attention."""

    def __init__(self, mask):
        self.mask = mask

    def conv(self, x, weight, bias):
        batch = x.shape[0]
        b = None if bias is None else bias.repeat(batch)
        y = conv_ref(_per_step(x.unsqueeze(-1)).squeeze(-1), weight.repeat(batch, 1), b)
        return _back(y.unsqueeze(-1), batch).squeeze(-1)

    def delta(self, q, k, v, g, beta):
        batch = q.shape[0]
        steps = [_per_step(t) for t in (q, k, v, g.unsqueeze(-1), beta.unsqueeze(-1))]
        return _back(gated_delta_ref(*steps[:3], steps[3][..., 0], steps[4][..., 0]), batch)

    def scan(self, x, dt, A, B, C, D):
        batch = x.shape[0]
        y = selective_scan_ref(
            _per_step(x),
            _per_step(dt.unsqueeze(-1))[..., 0],
            A.repeat(batch),
            _per_step(B),
            _per_step(C),
            D.repeat(batch),
        )
        return _back(y, batch)

    def attend(self, q, k, v):
        seqlen = q.shape[1]
        scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
        allowed = torch.ones(seqlen, seqlen, dtype=torch.bool).tril()[None, None]
        allowed = allowed & self.mask[:, None, None, :]
        p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return torch.einsum("bhst,bthd->bshd", p, v)
