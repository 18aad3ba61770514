"""packsched.kernels unpad / pad / pack_aligned / unpack_aligned through the bindings."""

import numpy as np
import pytest
import torch

from conftest import LENGTH_SWEEPS, cu_of
from packsched import kernels as k

DTYPES = [np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64]


def random_mask(lengths, rng):
    seqlen = 3 + max(lengths, default=0)
    mask = np.zeros((len(lengths), seqlen), dtype=bool)
    for b, n in enumerate(lengths):
        mask[b, rng.permutation(seqlen)[:n]] = True  # tokens anywhere in the row
    return mask


@pytest.mark.parametrize("lengths", LENGTH_SWEEPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_unpad_matches_reference_and_pad_inverts_it(lib, lengths, dtype):
    rng = np.random.default_rng(len(lengths))
    mask = random_mask(lengths, rng)
    x = (rng.standard_normal(mask.shape + (3,)) * 100).astype(dtype)

    x_packed, indices, cu, max_seqlen, seqused = k.unpad(lib.of(x), lib.of(mask))

    want_indices = np.flatnonzero(mask)
    assert all(lib.is_native(t) for t in (x_packed, indices, cu, seqused))
    np.testing.assert_array_equal(lib.np(indices), want_indices)
    np.testing.assert_array_equal(lib.np(x_packed), x.reshape(-1, 3)[want_indices])
    np.testing.assert_array_equal(lib.np(cu), cu_of(lengths))
    assert max_seqlen == max(lengths, default=0)
    np.testing.assert_array_equal(lib.np(seqused), lengths)

    back = k.pad(x_packed, indices, *mask.shape)
    np.testing.assert_array_equal(lib.np(back), np.where(mask[..., None], x, 0))


@pytest.mark.parametrize("mask_dtype", [bool, np.uint8, np.int32, np.int64])
def test_unpad_accepts_every_mask_dtype(lib, mask_dtype):
    mask = np.array([[1, 0, 1], [0, 0, 0], [0, 5, 1]]).astype(mask_dtype)
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    x_packed, indices, cu, max_seqlen, _ = k.unpad(lib.of(x), lib.of(mask))
    np.testing.assert_array_equal(lib.np(x_packed), [0, 2, 7, 8])
    np.testing.assert_array_equal(lib.np(cu), [0, 2, 2, 4])
    assert max_seqlen == 2


def test_unpad_uses_given_metadata(lib):
    mask = np.array([[1, 1, 0], [1, 0, 0]], dtype=bool)
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    cu = np.array([0, 2, 3], dtype=np.int32)
    x_packed, _, cu_out, max_seqlen, _ = k.unpad(
        lib.of(x), lib.of(mask), cu_seqlens=lib.of(cu), cu_seqlens_host=[0, 2, 3]
    )
    np.testing.assert_array_equal(lib.np(x_packed), [0, 1, 3])
    assert max_seqlen == 2
    with pytest.raises(ValueError, match="mask row 0 has 2 tokens but cu_seqlens gives 1"):
        k.unpad(lib.of(x), lib.of(mask), cu_seqlens=lib.of(np.array([0, 1, 3], np.int32)))


def test_unpad_packs_bfloat16_torch_tensors():
    mask = torch.tensor([[True, False], [True, True]])
    x = torch.randn(2, 2, 4).to(torch.bfloat16)
    x_packed, *_ = k.unpad(x, mask)
    assert x_packed.dtype == torch.bfloat16
    assert torch.equal(x_packed, x[mask])


@pytest.mark.parametrize("lengths", LENGTH_SWEEPS)
@pytest.mark.parametrize("align", [1, 8, 64])
def test_pack_aligned_pads_each_sequence_and_unpack_restores_it(lib, lengths, align):
    rng = np.random.default_rng(align)
    cu = cu_of(lengths)
    x = rng.integers(1, 1000, size=(cu[-1], 2)).astype(np.int64)

    x_aligned, cu_padded, seqused = k.pack_aligned(lib.of(x), lib.of(cu), align, pad_value=-7)

    padded = k.aligned_cu_seqlens(cu.tolist(), align)
    np.testing.assert_array_equal(lib.np(cu_padded), padded)
    np.testing.assert_array_equal(lib.np(seqused), lengths)
    want = np.full((padded[-1], 2), -7, dtype=np.int64)
    for b, n in enumerate(lengths):
        assert padded[b] % align == 0
        want[padded[b] : padded[b] + n] = x[cu[b] : cu[b + 1]]
    np.testing.assert_array_equal(lib.np(x_aligned), want)

    back = k.unpack_aligned(x_aligned, lib.of(cu), cu_padded)
    np.testing.assert_array_equal(lib.np(back), x)


def test_pack_aligned_fills_floats_with_the_pad_value(lib):
    x = np.ones((3, 2), dtype=np.float16)
    x_aligned, _, _ = k.pack_aligned(
        lib.of(x), lib.of(np.array([0, 3], np.int32)), 4, pad_value=0.5
    )
    np.testing.assert_array_equal(lib.np(x_aligned)[3], [0.5, 0.5])
