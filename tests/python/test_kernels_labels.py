"""packsched.kernels position_ids / shift_labels / packed_cross_entropy through the bindings."""

import numpy as np
import pytest
import torch

from conftest import LENGTH_SWEEPS, cu_of
from packsched import kernels as k


@pytest.mark.parametrize("lengths", LENGTH_SWEEPS)
def test_position_ids_restart_at_every_sequence(lib, lengths):
    pos = k.position_ids(lib.of(cu_of(lengths)))
    assert lib.is_native(pos)
    want = np.concatenate([np.arange(n) for n in lengths] + [np.zeros(0)]).astype(np.int64)
    np.testing.assert_array_equal(lib.np(pos), want)
    assert lib.np(pos).dtype == np.int64


def test_position_ids_of_pad_slots_continue_the_count(lib):
    pos = k.position_ids(lib.of(np.array([0, 4, 8], np.int32)), total=8)
    np.testing.assert_array_equal(lib.np(pos), [0, 1, 2, 3, 0, 1, 2, 3])


def reference_labels(ids, cu, layout, ignore):
    labels = np.full_like(ids, ignore)
    for b in range(len(cu) - 1):
        n = cu[b + 1] - cu[b]
        if n == 0:
            continue
        labels[layout[b] : layout[b] + n - 1] = ids[layout[b] + 1 : layout[b] + n]
    return labels


@pytest.mark.parametrize("lengths", LENGTH_SWEEPS)
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_shift_labels_never_cross_a_boundary(lib, lengths, id_dtype):
    rng = np.random.default_rng(3)
    cu = cu_of(lengths)
    ids = rng.integers(0, 50000, size=cu[-1]).astype(id_dtype)
    labels = k.shift_labels(lib.of(ids), lib.of(cu), ignore_index=-100)
    assert lib.np(labels).dtype == id_dtype
    np.testing.assert_array_equal(lib.np(labels), reference_labels(ids, cu, cu, -100))


def test_shift_labels_on_the_aligned_layout_ignore_pads(lib):
    cu = np.array([0, 3, 4], np.int32)
    ids = np.array([1, 2, 3, 4], np.int64)
    ids_aligned, cu_padded, _ = k.pack_aligned(lib.of(ids), lib.of(cu), 4, pad_value=0)
    labels = k.shift_labels(ids_aligned, lib.of(cu), ignore_index=-1, cu_seqlens_padded=cu_padded)
    np.testing.assert_array_equal(lib.np(labels), [2, 3, -1, -1, -1, -1, -1, -1])


def reference_cross_entropy(logits, labels, ignore):
    logits = logits.astype(np.float64)
    m = logits.max(axis=1, keepdims=True) if len(logits) else np.zeros((0, 1))
    lse = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))[:, 0]
    safe = np.where(labels == ignore, 0, labels)
    loss = lse - logits[np.arange(len(labels)), safe]
    return np.where(labels == ignore, 0.0, loss)


@pytest.mark.parametrize("lengths", LENGTH_SWEEPS)
@pytest.mark.parametrize(
    "dtype,rtol", [(np.float16, 2e-3), (np.float32, 1e-5), (np.float64, 1e-12)]
)
def test_packed_cross_entropy_matches_a_float64_reference(lib, lengths, dtype, rtol):
    rng = np.random.default_rng(5)
    cu = cu_of(lengths)
    vocab = 37
    logits = (rng.standard_normal((cu[-1], vocab)) * 3).astype(dtype)
    labels = rng.integers(0, vocab, size=cu[-1])
    labels[rng.random(cu[-1]) < 0.2] = -100

    loss, sums, counts = k.packed_cross_entropy(lib.of(logits), lib.of(labels), lib.of(cu))

    assert all(lib.is_native(t) for t in (loss, sums, counts))
    assert lib.np(loss).dtype == dtype and lib.np(sums).dtype == dtype
    want = reference_cross_entropy(logits, labels, -100)
    np.testing.assert_allclose(lib.np(loss), want, rtol=rtol, atol=rtol)
    assert np.all(lib.np(loss)[labels == -100] == 0)
    for b in range(len(lengths)):
        np.testing.assert_allclose(
            lib.np(sums)[b], want[cu[b] : cu[b + 1]].sum(), rtol=rtol * 10, atol=rtol * 10
        )
        assert lib.np(counts)[b] == np.sum(labels[cu[b] : cu[b + 1]] != -100)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_cross_entropy_agrees_with_torch(dtype):
    torch.manual_seed(0)
    logits = torch.randn(50, 11).to(dtype)
    labels = torch.randint(0, 11, (50,))
    labels[::7] = -100
    cu = torch.tensor([0, 20, 20, 50], dtype=torch.int32)
    loss, sums, counts = k.packed_cross_entropy(logits, labels, cu)
    want = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(loss.float(), want, rtol=tol, atol=tol)
    valid = labels != -100
    torch.testing.assert_close(
        counts, torch.stack([valid[0:20].sum(), valid[20:20].sum(), valid[20:50].sum()])
    )
    torch.testing.assert_close(
        sums.float(),
        torch.stack([want[0:20].sum(), want[20:20].sum(), want[20:50].sum()]),
        rtol=tol,
        atol=tol,
    )
