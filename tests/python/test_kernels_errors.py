"""Invalid arguments raise ValueError with the C++ message, which names the argument."""

import numpy as np
import pytest

from packsched import kernels as k


def test_cu_seqlens_must_be_int32(lib):
    with pytest.raises(ValueError, match="cu_seqlens must be int32, got int64"):
        k.position_ids(lib.of(np.array([0, 2], np.int64)))


def test_cu_seqlens_must_be_non_decreasing(lib):
    with pytest.raises(ValueError, match=r"cu_seqlens\[2\] = 1 < cu_seqlens\[1\] = 3"):
        k.position_ids(lib.of(np.array([0, 3, 1], np.int32)))


def test_total_must_match(lib):
    # A total above cu_seqlens[-1] declares a tail (positions restart at 0); below, it is an error.
    with pytest.raises(ValueError, match="total = 2 must be at least the layout's last offset 3"):
        k.position_ids(lib.of(np.array([0, 3], np.int32)), total=2)
    with pytest.raises(ValueError, match="total mismatch: ids"):
        k.shift_labels(lib.of(np.zeros(5, np.int64)), lib.of(np.array([0, 3], np.int32)))


def test_unsupported_dtypes_are_named(lib):
    with pytest.raises(ValueError, match="unsupported dtype for logits: int64"):
        k.packed_cross_entropy(
            lib.of(np.zeros((2, 3), np.int64)),
            lib.of(np.zeros(2, np.int64)),
            lib.of(np.array([0, 2], np.int32)),
        )
    with pytest.raises(ValueError, match="unsupported dtype for mask: float32"):
        k.unpad(
            lib.of(np.zeros((1, 2), np.float32)),
            lib.of(np.zeros((1, 2), np.float32)),
            cu_seqlens=lib.of(np.array([0, 0], np.int32)),
        )


def test_labels_outside_the_vocabulary_are_rejected(lib):
    with pytest.raises(ValueError, match=r"labels\[0\] = 3 is outside \[0, 3\)"):
        k.packed_cross_entropy(
            lib.of(np.zeros((1, 3), np.float32)),
            lib.of(np.array([3])),
            lib.of(np.array([0, 1], np.int32)),
        )


def test_a_wrong_host_copy_is_caught(lib):
    with pytest.raises(ValueError, match="host copy differs"):
        k.position_ids(lib.of(np.array([0, 2], np.int32)), cu_seqlens_host=[0, 3])


def test_non_dlpack_inputs_raise_type_error():
    with pytest.raises(TypeError):
        k.position_ids([0, 1, 2])


def _cu_calls(cu):
    """Every function that takes offsets, called with `cu` as (one of) them: (name, call)."""
    x = np.zeros((2, 8), np.float32)
    ids = np.zeros(2, np.int64)
    good = np.array([0, 2], np.int32)
    q = np.zeros((2, 1, 8), np.float32)
    return [
        ("cu_seqlens", lambda: k.position_ids(cu)),
        ("cu_seqlens", lambda: k.shift_labels(ids, cu)),
        ("cu_seqlens_padded", lambda: k.shift_labels(ids, good, cu_seqlens_padded=cu)),
        ("cu_seqlens", lambda: k.pack_aligned(x, cu, 4)),
        ("cu_seqlens_padded", lambda: k.unpack_aligned(x, good, cu)),
        ("cu_seqlens", lambda: k.packed_cross_entropy(x, ids, cu)),
        ("cu_seqlens", lambda: k.unpad(x[None], np.ones((1, 2), bool), cu_seqlens=cu)),
        ("cu_seqlens_q", lambda: k.varlen_attention_forward(q, q, q, cu, good, 2, 2)),
        ("cu_seqlens_k", lambda: k.varlen_attention(q, q, q, good, cu, 2, 2)),
    ]


@pytest.mark.parametrize(
    "cu", [np.array([[0, 2]], np.int32), np.array([], np.int32)], ids=["2-D", "empty"]
)
def test_offsets_must_be_one_dimensional_and_non_empty(lib, cu):
    for name, call in _cu_calls(lib.of(cu)):
        with pytest.raises(ValueError, match=rf"^{name} must be a 1-D int32 tensor of B \+ 1 >= 1"):
            call()


def test_an_empty_host_copy_is_named(lib):
    with pytest.raises(ValueError, match="cu_seqlens_host must hold B \\+ 1 >= 1 offsets"):
        k.position_ids(lib.of(np.array([0, 2], np.int32)), cu_seqlens_host=[])


def test_attention_scale_and_softcap_must_fit_float32(lib):
    q = lib.of(np.ones((4, 1, 8), np.float32))
    cu = lib.of(np.array([0, 4], np.int32))
    with pytest.raises(ValueError, match="softmax_scale must be finite as a float32"):
        k.varlen_attention_forward(q, q, q, cu, cu, 4, 4, softmax_scale=1e39)
    with pytest.raises(
        ValueError, match="softcap must be 0 \\(off\\) or a normal positive float32"
    ):
        k.varlen_attention_forward(q, q, q, cu, cu, 4, 4, softcap=1e-46)
