"""The per-sequence data of a request (``seq_lens``, ``loss_tokens``, ``group_ids``), checked once.

``SchedulerClient`` and ``packsched.planner`` both take their arrays through ``int_array``, so the
same bad input raises the same exception with the same message on either path, before anything
is planned or sent:

- TypeError for data that is not integers: a value that is a float, a string, a bool (True is
  not a length of 1), a nested list, None; an array or tensor of a non-integer dtype;
- ValueError for the shape: an array of more than one dimension, an empty ``seq_lens`` (nothing
  to plan, as the sidecar and ``packsched plan`` say), a value that does not fit in int64.

The ranges of the values (a length of 0, a loss token count above its length) are the planner's
to judge: its message is the same in process (ValueError) and from the sidecar
(INVALID_ARGUMENT).
"""

import numpy as np

__all__ = ["int_array"]

_INT64_MAX = np.uint64(np.iinfo(np.int64).max)
_BOOLS = (bool, np.bool_)


def _first(values, bad):
    """(index, value) of the first value of the Python sequence ``values`` for which ``bad``
    holds."""
    return next((i, v) for i, v in enumerate(values) if bad(v))


def _not_int(v):
    return isinstance(v, _BOOLS) or not isinstance(v, (int, np.integer))


def _check_python_values(values, name):
    # Only a Python sequence can mix types: numpy would turn [3, True] into [3, 1].
    types = set(map(type, values))
    if types & set(_BOOLS) or not all(issubclass(t, (int, np.integer)) for t in types):
        i, v = _first(values, _not_int)
        raise TypeError(f"{name}[{i}] = {v!r}: must be an integer, not {type(v).__name__}")


def _int64_range_error(values, name):
    i, v = _first(values, lambda v: not -(2**63) <= int(v) < 2**63)
    return ValueError(f"{name}[{i}] = {v}: does not fit in int64")


def int_array(values, name, *, allow_empty=False):
    """``values`` as a contiguous one-dimensional int64 numpy array.

    ``values``: a list, tuple or other iterable of ints, a numpy array or a torch tensor (any
    device) of an integer dtype. ``name`` names the argument in messages. Raises TypeError or
    ValueError as the module docstring says; an empty ``values`` raises ValueError unless
    ``allow_empty``."""
    if type(values).__module__.startswith("torch"):
        values = values.detach().cpu().numpy()
    if not isinstance(values, np.ndarray):
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
            raise TypeError(f"{name} must be a sequence of integers, got {type(values).__name__}")
        if not isinstance(values, (list, tuple)):
            values = list(values)
        if values and not all(isinstance(v, (list, tuple, np.ndarray)) for v in values[:1]):
            _check_python_values(values, name)
        try:
            array = np.asarray(values)
        except ValueError:  # ragged nesting
            i, v = _first(values, _not_int)
            raise TypeError(
                f"{name}[{i}] = {v!r}: must be an integer, not {type(v).__name__}"
            ) from None
        if array.dtype == object and array.ndim == 1:  # Python ints beyond 64 bits
            raise _int64_range_error(values, name)
        values = array
    if values.size == 0:
        if not allow_empty:
            raise ValueError(f"{name} is empty: nothing to plan")
        values = values.astype(np.int64)
    if values.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {values.shape}")
    if values.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {values.dtype}")
    if values.dtype.kind == "u" and values.size and values.max() > _INT64_MAX:
        raise _int64_range_error(values, name)
    return np.ascontiguousarray(values, dtype=np.int64)
