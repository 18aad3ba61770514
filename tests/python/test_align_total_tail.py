"""The align_total_to tail, end to end: a plan made with align_total_to = 8 (Ulysses sequence
parallelism) gives each micro-batch `total` rows, and the kernels build exactly that many.

Tail rows [cu_seqlens_aligned[-1], total) hold the pad id, positions restarting at 0 (verl's
Ulysses padding), ignore_index labels, zero loss; attention never uses them as keys. The packed
loss and gradient of a tiny causal LM equal the padded reference's, and per-token outputs
restore to the original order with the tail dropped.
"""

import pathlib
import sys

import numpy as np
import pytest
import torch

from packsched import kernels as k
from packsched import planner

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parents[2] / "client" / "python" / "examples")
)

import tiny_lm  # noqa: E402

ALIGN_TOTAL = 8
PAD_ID = 60
CAP = 160
SEED = 2  # a batch whose plans give at least two micro-batches a tail at align_to 1 and 4


def make_plan(ids, masks, align_to):
    return planner.plan_local(
        [len(x) for x in ids],
        CAP,
        align_to=align_to,
        align_total_to=ALIGN_TOTAL,
        loss_tokens=tiny_lm.loss_tokens(masks),
        loss_mode="token_mean",
    )


@pytest.mark.parametrize("align_to", [1, 4])
def test_kernels_build_exactly_total_rows_with_a_defined_tail(lib, align_to):
    ids, masks = tiny_lm.make_batch(9, seed=SEED)
    plan = make_plan(ids, masks, align_to)
    tails = 0
    for indices, meta in zip(plan.micro_batches, plan.metadata):
        assert meta.total % ALIGN_TOTAL == 0
        packed = lib.of(np.concatenate([np.zeros(0, np.int64)] + [ids[i].numpy() for i in indices]))
        cu = lib.of(np.asarray(meta.cu_seqlens, np.int32))
        ids_a, cu_a, seqused = k.pack_aligned(
            packed, cu, align_to, pad_value=PAD_ID, total=meta.total
        )
        end = meta.cu_seqlens_aligned[-1]
        tail = meta.total - end
        tails += tail > 0
        assert tuple(ids_a.shape) == (meta.total,)
        assert lib.np(cu_a).tolist() == meta.cu_seqlens_aligned  # the plan's offsets, as built
        assert lib.np(seqused).tolist() == np.diff(meta.cu_seqlens).tolist()
        assert (lib.np(ids_a)[end:] == PAD_ID).all()

        pos = lib.np(k.position_ids(cu_a, total=meta.total))
        assert pos[end:].tolist() == list(range(tail))
        labels = lib.np(k.shift_labels(ids_a, cu, cu_seqlens_padded=cu_a, total=meta.total))
        assert (labels[end:] == -100).all()
        # The last real token of the last sequence does not learn the tail's pad id.
        if len(indices):
            assert (
                labels[meta.cu_seqlens_aligned[-2] + meta.cu_seqlens[-1] - meta.cu_seqlens[-2] - 1]
                == -100
            )

        logits = lib.of(np.random.default_rng(0).standard_normal((meta.total, 5)))
        loss, _, counts = k.packed_cross_entropy(
            logits, lib.of(np.where(labels < 0, -100, 1)), cu_a, total=meta.total
        )
        assert (lib.np(loss)[end:] == 0).all()
        assert lib.np(counts).sum() == (labels[:end] != -100).sum()
        # Restore round trip: the real rows come back, the tail is dropped.
        back = k.unpack_aligned(ids_a, cu, cu_a, total=meta.total)
        assert lib.np(back).tolist() == lib.np(packed).tolist()
    assert tails >= 2, "the batch must give micro-batches a tail"


def test_without_total_the_rows_must_match():
    cu = np.array([0, 3], np.int32)
    with pytest.raises(ValueError, match="total = 4 must be at least the layout's last offset 8"):
        k.pack_aligned(np.arange(3), cu, 8, total=4)
    with pytest.raises(ValueError, match="total mismatch: ids has shape \\[8\\]"):
        k.shift_labels(np.zeros(8, np.int64), cu)


def test_attention_tail_rows_are_zero_and_never_keys():
    torch.manual_seed(0)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    seqused = torch.tensor([3, 4], dtype=torch.int32)
    q, kk, v = (torch.randn(11, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, lse = k.varlen_attention(
        q,
        kk,
        v,
        cu,
        cu,
        4,
        4,
        causal=True,
        seqused_q=seqused,
        seqused_k=seqused,
        return_lse=True,
        total_q=11,
        total_k=11,
    )
    assert (out[8:] == 0).all() and torch.isinf(lse[:, 8:]).all()
    out.sum().backward()
    assert (q.grad[8:] == 0).all() and (kk.grad[8:] == 0).all() and (v.grad[8:] == 0).all()
    # Changing the tail's keys and values changes nothing.
    kk2, v2 = kk.detach().clone(), v.detach().clone()
    kk2[8:], v2[8:] = 1e3, float("nan")
    out2 = k.varlen_attention(
        q.detach(),
        kk2,
        v2,
        cu,
        cu,
        4,
        4,
        causal=True,
        seqused_q=seqused,
        seqused_k=seqused,
        total_q=11,
        total_k=11,
    )
    assert torch.equal(out2, out.detach())


@pytest.mark.parametrize("align_to", [1, 4])
def test_tail_packed_gradient_equals_the_padded_batch(align_to):
    ids, masks = tiny_lm.make_batch(9, seed=SEED)
    plan = make_plan(ids, masks, align_to)
    assert any(m.total > m.cu_seqlens_aligned[-1] for m in plan.metadata)
    assert plan.num_micro_batches >= 2

    packed = tiny_lm.TinyCausalLM(dtype=torch.float64)
    tiny_lm.packed_backward(packed, plan, ids, masks, align_to=align_to, pad_id=PAD_ID)
    reference = tiny_lm.TinyCausalLM(dtype=torch.float64)
    tiny_lm.padded_loss(reference, ids, masks, "token_mean").backward()
    got, want = tiny_lm.flat_grad(packed), tiny_lm.flat_grad(reference)
    assert float((got - want).abs().max()) <= 1e-10 * max(1.0, float(want.abs().max()))


def test_empty_micro_batches_run_an_all_tail_dummy_and_the_gradient_still_equals_padded():
    ids, masks = tiny_lm.make_batch(9, seed=SEED)
    plan = planner.plan_local(
        [len(x) for x in ids],
        CAP,
        align_to=4,
        align_total_to=ALIGN_TOTAL,
        loss_tokens=tiny_lm.loss_tokens(masks),
        loss_mode="token_mean",
        min_micro_batches=len(ids) + 3,
    )
    assert any(m.empty for m in plan.metadata)
    packed = tiny_lm.TinyCausalLM(dtype=torch.float64)
    tiny_lm.packed_backward(
        packed, plan, ids, masks, align_to=4, pad_id=PAD_ID, align_total_to=ALIGN_TOTAL
    )
    reference = tiny_lm.TinyCausalLM(dtype=torch.float64)
    tiny_lm.padded_loss(reference, ids, masks, "token_mean").backward()
    got, want = tiny_lm.flat_grad(packed), tiny_lm.flat_grad(reference)
    assert float((got - want).abs().max()) <= 1e-10 * max(1.0, float(want.abs().max()))


def test_cross_entropy_over_an_all_tail_layout_has_zero_loss_and_gradient():
    logits = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 5, (8,))  # tail labels are never read, valid or not
    loss, sums, counts = k.packed_cross_entropy(
        logits, labels, torch.zeros(1, dtype=torch.int32), total=8
    )
    assert loss.shape == (8,) and sums.shape == (0,) and counts.shape == (0,)
    assert (loss == 0).all()
    loss.sum().backward()
    assert (logits.grad == 0).all()


def test_tail_rows_get_no_gradient_and_real_rows_the_reference_one():
    torch.manual_seed(1)
    cu, end, total = torch.tensor([0, 3, 5], dtype=torch.int32), 5, 8
    logits = torch.randn(total, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 6, (total,))  # real labels on the tail rows too
    labels[2] = -100
    loss, sums, _ = k.packed_cross_entropy(logits, labels, cu, total=total)
    (3 * loss.sum() + (sums * torch.tensor([0.5, 2.0], dtype=torch.float64)).sum()).backward()

    ref_logits = logits.detach()[:end].clone().requires_grad_(True)
    nll = -torch.log_softmax(ref_logits, dim=-1)[torch.arange(end), labels[:end].clamp(min=0)]
    nll = torch.where(labels[:end] == -100, torch.zeros_like(nll), nll)
    seq_weight = torch.tensor([0.5, 0.5, 0.5, 2.0, 2.0], dtype=torch.float64)
    ((3 + seq_weight) * nll).sum().backward()
    torch.testing.assert_close(logits.grad[:end], ref_logits.grad, rtol=1e-12, atol=1e-12)
    assert (logits.grad[end:] == 0).all()


@pytest.mark.parametrize(
    "total, error, match",
    [
        (-1, ValueError, "total = -1 must be at least the layout's last offset 3"),
        (2, ValueError, "total = 2 must be at least the layout's last offset 3"),
        (8.9, TypeError, "total must be an int, got float"),
        ("7", TypeError, "total must be an int, got str"),
    ],
)
def test_a_bad_total_is_named(total, error, match):
    cu = np.array([0, 3], np.int32)
    with pytest.raises(error, match=match):
        k.position_ids(cu, total=total)
    with pytest.raises(error, match=match):
        k.packed_cross_entropy(np.zeros((3, 4)), np.zeros(3, np.int64), cu, total=total)
    with pytest.raises(error, match=match.replace("offset 3", "offset 4")):
        k.pack_aligned(np.arange(3), cu, 4, total=total)


def test_attention_names_a_bad_total_q():
    cu = torch.tensor([0, 4], dtype=torch.int32)
    q = torch.zeros(4, 1, 8)
    with pytest.raises(ValueError, match="total_q = 3 must be at least the layout's last offset 4"):
        k.varlen_attention(q, q, q, cu, cu, 4, 4, total_q=3, total_k=4)


def test_tail_per_token_log_probs_restore_to_the_padded_ones():
    ids, masks = tiny_lm.make_batch(9, seed=SEED)
    plan = make_plan(ids, masks, align_to=4)
    model = tiny_lm.TinyCausalLM(dtype=torch.float64)
    pieces = []
    with torch.no_grad():
        for indices, meta in zip(plan.micro_batches, plan.metadata):
            if meta.empty:
                pieces.append([])
                continue
            packed = torch.cat([ids[i] for i in indices])
            cu = torch.tensor(meta.cu_seqlens, dtype=torch.int32)
            ids_a, cu_a, seqused = k.pack_aligned(packed, cu, 4, pad_value=PAD_ID, total=meta.total)
            pos = k.position_ids(cu_a, total=meta.total)
            labels = k.shift_labels(ids_a, cu, cu_seqlens_padded=cu_a, total=meta.total)
            logits = model.forward_packed(
                ids_a,
                pos,
                cu_a,
                meta.cu_seqlens_aligned,
                meta.max_seqlen_aligned,
                seqused=seqused,
                total=meta.total,
            )
            loss, _, _ = k.packed_cross_entropy(logits, labels, cu_a, total=meta.total)
            loss = k.unpack_aligned(loss, cu, cu_a, total=meta.total)
            pieces.append([loss[a:b] for a, b in zip(meta.cu_seqlens, meta.cu_seqlens[1:])])
        restored = plan.restore(pieces)

        batch, seqlen = len(ids), max(len(x) for x in ids)
        tokens = torch.zeros(batch, seqlen, dtype=torch.int64)
        real = torch.zeros(batch, seqlen, dtype=torch.bool)
        for b, x in enumerate(ids):
            tokens[b, : len(x)], real[b, : len(x)] = x, True
        logp = torch.log_softmax(model.forward_padded(tokens, real), dim=-1)
    for b, x in enumerate(ids):
        want = -logp[b, torch.arange(len(x) - 1), x[1:]]
        torch.testing.assert_close(restored[b][:-1], want, rtol=1e-12, atol=1e-12)
        assert restored[b][-1] == 0  # the last token has no label
