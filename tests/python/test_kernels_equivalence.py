"""Padded and packed batches give the same log-probs for a fixed random logit model.

The model's logits for a token depend on its id and its position id: logits = E[id] + P[pos].
The padded path computes log-probs the classic way ([B, S] batch, positions and next-token labels
per row). The packed paths run unpad / position_ids / shift_labels / packed_cross_entropy (and
the aligned THD variant) and must agree token for token: a wrong position, a label taken across
a sequence boundary, or a mis-scattered row changes the log-probs.
"""

import numpy as np
import pytest
import torch

from packsched import kernels as k

VOCAB, MAX_POS = 64, 40
rng = np.random.default_rng(1234)
E = torch.from_numpy(rng.standard_normal((VOCAB, VOCAB)))
P = torch.from_numpy(rng.standard_normal((MAX_POS, VOCAB)))


def model(ids, pos):
    return E[ids] + P[pos]


def padded_log_probs(ids, mask):
    """log p(next token) at every real token that has a next token in its row; NaN elsewhere."""
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    logp = torch.log_softmax(model(ids, pos), dim=-1)
    out = torch.full(ids.shape, float("nan"), dtype=torch.float64)
    for b in range(ids.shape[0]):
        slots = mask[b].nonzero().flatten().tolist()
        for here, nxt in zip(slots, slots[1:]):
            out[b, here] = logp[b, here, ids[b, nxt]]
    return out


def batch(left_padded):
    lengths = [5, 1, 0, 17, 9]
    seqlen = max(lengths) + 2
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if left_padded:
            mask[b, seqlen - n :] = True
        else:
            mask[b, :n] = True
    ids = torch.from_numpy(rng.integers(1, VOCAB, size=mask.shape)).masked_fill(~mask, 0)
    return ids, mask


@pytest.mark.parametrize("left_padded", [False, True])
def test_packed_log_probs_equal_padded_log_probs(left_padded):
    ids, mask = batch(left_padded)
    want = padded_log_probs(ids, mask)

    ids_p, indices, cu, _, _ = k.unpad(ids, mask)
    pos = k.position_ids(cu)
    labels = k.shift_labels(ids_p, cu)
    loss, _, counts = k.packed_cross_entropy(model(ids_p, pos), labels, cu)
    got = k.pad(-loss.unsqueeze(1), indices, *ids.shape).squeeze(2)

    has_label = ~torch.isnan(want)
    torch.testing.assert_close(got[has_label], want[has_label], rtol=1e-12, atol=1e-12)
    assert counts.sum() == has_label.sum()


def test_aligned_layout_gives_the_same_log_probs():
    ids, mask = batch(left_padded=False)
    want = padded_log_probs(ids, mask)

    ids_p, indices, cu, _, _ = k.unpad(ids, mask)
    ids_a, cu_padded, _ = k.pack_aligned(ids_p, cu, align=8, pad_value=0)
    pos = k.position_ids(cu_padded)
    labels = k.shift_labels(ids_a, cu, cu_seqlens_padded=cu_padded)
    loss_a, _, _ = k.packed_cross_entropy(model(ids_a, pos), labels, cu_padded)
    loss = k.unpack_aligned(loss_a, cu, cu_padded)
    got = k.pad(-loss.unsqueeze(1), indices, *ids.shape).squeeze(2)

    has_label = ~torch.isnan(want)
    torch.testing.assert_close(got[has_label], want[has_label], rtol=1e-12, atol=1e-12)
