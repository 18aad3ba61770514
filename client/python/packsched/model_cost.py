"""The attention cost's weights from a model (docs/design.md §2, "Cost from the model").

``model_cost(config, max_batch_tokens, longest)`` reads a Hugging Face style ``config.json`` (a
dict, or the path of the file) and returns ``(linear, quadratic, micro_batch)``: integer
weights with forward + backward FLOPs of a sequence of L tokens = linear * L + quadratic * L^2
(times a power of two), plus ``micro_batch`` per micro-batch (the linear cost of
``overhead_tokens`` tokens). The arithmetic is the planner's own (server/planner/model_cost.h),
so ``packsched plan --model_config`` gives the same weights.
"""

import json
import os

from . import _planner

__all__ = ["model_cost", "model_fields"]


def model_fields(config):
    """(integer fields, string fields) of a config: a dict, or the path of a config.json."""
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            config = json.load(f)
    if not isinstance(config, dict):
        raise TypeError(f"model_config must be a dict or a path, got {type(config).__name__}")
    ints = {k: v for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool)}
    strings = {k: v for k, v in config.items() if isinstance(v, str)}
    return ints, strings


def model_cost(config, max_batch_tokens, longest, overhead_tokens=2048):
    """-> (linear, quadratic, micro_batch) for ``config`` (dict or path of a config.json), scaled
    so that ``max_batch_tokens`` tokens in sequences of at most ``longest`` cost at most 2^62."""
    ints, strings = model_fields(config)
    try:
        linear, quadratic, micro_batch, _ = _planner.model_cost(
            ints, strings, int(max_batch_tokens), int(longest), int(overhead_tokens)
        )
    except OverflowError as e:
        raise ValueError(f"model_config: a value does not fit in int64 ({e})") from e
    return linear, quadratic, micro_batch
