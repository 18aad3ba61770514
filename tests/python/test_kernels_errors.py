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
    with pytest.raises(ValueError, match="position_ids must have shape"):
        k.position_ids(lib.of(np.array([0, 3], np.int32)), total=4)
    with pytest.raises(ValueError, match="total mismatch: ids"):
        k.shift_labels(lib.of(np.zeros(5, np.int64)), lib.of(np.array([0, 3], np.int32)))


def test_unsupported_dtypes_are_named(lib):
    with pytest.raises(ValueError, match="unsupported dtype for logits: int64"):
        k.packed_cross_entropy(lib.of(np.zeros((2, 3), np.int64)), lib.of(np.zeros(2, np.int64)),
                               lib.of(np.array([0, 2], np.int32)))
    with pytest.raises(ValueError, match="unsupported dtype for mask: float32"):
        k.unpad(lib.of(np.zeros((1, 2), np.float32)), lib.of(np.zeros((1, 2), np.float32)),
                cu_seqlens=lib.of(np.array([0, 0], np.int32)))


def test_labels_outside_the_vocabulary_are_rejected(lib):
    with pytest.raises(ValueError, match=r"labels\[0\] = 3 is outside \[0, 3\)"):
        k.packed_cross_entropy(lib.of(np.zeros((1, 3), np.float32)), lib.of(np.array([3])),
                               lib.of(np.array([0, 1], np.int32)))


def test_a_wrong_host_copy_is_caught(lib):
    with pytest.raises(ValueError, match="host copy differs"):
        k.position_ids(lib.of(np.array([0, 2], np.int32)), cu_seqlens_host=[0, 3])


def test_non_dlpack_inputs_raise_type_error():
    with pytest.raises(TypeError):
        k.position_ids([0, 1, 2])
