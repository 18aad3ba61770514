"""Shared fixtures: every kernel test runs once with numpy arrays and once with torch tensors.

One OpenMP thread per process, for the tests and every rank process they start (set before torch
is imported, inherited by children): PyPI's torch runs MKL on libgomp, whose threads spin while
they wait, and several rank processes on a 2-core machine each spinning two threads starve one
another (a 2-rank gradient test went from seconds to many minutes)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


class Lib:
    """Converts numpy test data into the library under test and back."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name

    def of(self, array):
        return torch.from_numpy(np.ascontiguousarray(array)) if self.name == "torch" else array

    def np(self, x):
        if isinstance(x, torch.Tensor):
            if x.dtype == torch.bfloat16:
                x = x.float()
            return x.numpy()
        return np.asarray(x)

    def is_native(self, x):
        return isinstance(x, torch.Tensor if self.name == "torch" else np.ndarray)


@pytest.fixture(params=["numpy", "torch"])
def lib(request):
    return Lib(request.param)


# The length sweeps of the C++ tests: each length alone, all together with empty sequences, B = 0.
LENGTH_SWEEPS = [[0], [1], [97], [128], [1025], [0, 1, 97, 0, 128, 1025, 0], []]


def cu_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)
