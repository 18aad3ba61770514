"""A tiny model with 3-D rotary positions (Qwen2-VL's mrope: the rotary frequencies split into
temporal, height and width sections, each rotated by its own row of position ids), run packed —
positions from packsched.kernels.mrope_position_ids, boundaries from cu_seqlens, varlen attention —
equals the same model run sequence by sequence with dense attention and each sequence's positions
from the float64 reference of test_kernels_mrope.py: loss and gradients, float64, 1e-10."""

import math
import pathlib
import sys

import torch

from packsched import kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_kernels_mrope import IMAGE, TEXT, VIDEO, reference_positions, sequence  # noqa: E402

VOCAB, DIM, HEADS, HEAD_DIM = 23, 16, 2, 8
SECTIONS = [2, 1, 1]  # rotary frequency pairs per position row (t, h, w): HEAD_DIM / 2 in all


class TinyMropeModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, DIM, generator=g, dtype=torch.float64))
        self.qkv = torch.nn.Parameter(
            torch.randn(DIM, 3 * HEADS * HEAD_DIM, generator=g, dtype=torch.float64) * 0.3
        )
        self.out = torch.nn.Parameter(
            torch.randn(HEADS * HEAD_DIM, VOCAB, generator=g, dtype=torch.float64) * 0.3
        )

    def qkv_rotated(self, tokens, positions):
        """tokens [T] (ids mod VOCAB), positions float64 or int [3, T] -> q, k, v [T, H, D]."""
        x = self.embed[tokens % VOCAB]
        q, k, v = (x @ self.qkv).view(len(tokens), 3, HEADS, HEAD_DIM).unbind(1)
        inv = 1.0 / (
            10000.0 ** (torch.arange(HEAD_DIM // 2, dtype=torch.float64) / (HEAD_DIM // 2))
        )
        row = torch.repeat_interleave(torch.arange(3), torch.tensor(SECTIONS))
        angle = positions.double()[row].T * inv  # [T, D/2]: pair i rotates by its row's position
        cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]

        def rotate(t):
            a, b = t[..., : HEAD_DIM // 2], t[..., HEAD_DIM // 2 :]
            return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

        return rotate(q), rotate(k), v

    def logits(self, attended):
        return attended.reshape(len(attended), -1) @ self.out


def per_token_loss(model, logits, tokens):
    labels = torch.cat([tokens[1:] % VOCAB, torch.tensor([-100])])
    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")


SEQUENCES = [
    [6],
    [3, ("image", 1, 4, 6), 4],
    [2, ("video", 3, 4, 4), 2, ("image", 1, 2, 4), 1],
    [1, ("image", 1, 8, 2), 5],
]


def test_packed_mrope_model_equals_the_model_run_per_sequence():
    seqs = [sequence(s, 2) for s in SEQUENCES]
    g = torch.Generator().manual_seed(1)
    token_ids = [
        torch.where(
            torch.tensor(ids) == TEXT,
            torch.randint(0, VOCAB, (len(ids),), generator=g),
            torch.tensor(ids),
        )
        for ids, _, _ in seqs
    ]

    # Per sequence: dense causal attention, positions from the float64 reference.
    model = TinyMropeModel()
    reference_loss = 0.0
    for (ids, images, videos), tokens in zip(seqs, token_ids):
        positions = reference_positions(ids, images, videos, 2)
        q, k, v = model.qkv_rotated(tokens, positions)
        s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(HEAD_DIM)
        mask = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
        a = torch.einsum("hij,jhd->ihd", torch.softmax(s.masked_fill(~mask, -math.inf), -1), v)
        reference_loss = reference_loss + per_token_loss(model, model.logits(a), tokens)
    reference_loss.backward()
    expected = [p.grad.clone() for p in model.parameters()]

    # Packed: one buffer, positions from the kernel, boundaries from cu_seqlens only.
    model = TinyMropeModel()
    cu = [0]
    types, grids, counts = [], [], []
    for ids, images, videos in seqs:
        cu.append(cu[-1] + len(ids))
        types += [0 if i == TEXT else 1 for i in ids]
        it_i, it_v, end, n = iter(images), iter(videos), 0, 0
        for pos, i in enumerate(ids):
            if i != TEXT and pos >= end:
                t, h, w = next(it_i) if i == IMAGE else next(it_v)
                assert i in (IMAGE, VIDEO)
                grids.append((t, h, w))
                end, n = pos + t * (h // 2) * (w // 2), n + 1
        counts.append(n)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    positions, cu_out = kernels.mrope_position_ids(
        torch.tensor(types), cu_t, grids, counts, spatial_merge_size=2
    )
    tokens = torch.cat(token_ids)
    q, k, v = model.qkv_rotated(tokens, positions)
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    a = kernels.varlen_attention(q, k, v, cu_out, cu_out, longest, longest, causal=True)
    logits = model.logits(a)
    labels = kernels.shift_labels(tokens % VOCAB, cu_t)
    _, sums, _ = kernels.packed_cross_entropy(logits, labels, cu_t)
    packed_loss = sums.sum()
    packed_loss.backward()

    assert abs(float(packed_loss) - float(reference_loss)) <= 1e-10 * abs(float(reference_loss))
    for got, want in zip((p.grad for p in model.parameters()), expected):
        scale = max(1.0, float(want.abs().max()))
        assert float((got - want).abs().max()) <= 1e-10 * scale
