"""The attention cost's weights from a model (docs/design.md §2, "Cost from the model").

``model_cost(config, max_batch_tokens, longest)`` reads a Hugging Face style ``config.json`` (a
dict, or the path of the file) and returns ``(linear, quadratic, micro_batch)``: integer
weights with forward + backward FLOPs of a sequence of L tokens = linear * L + quadratic * L^2
(times a power of two), plus ``micro_batch`` per micro-batch (the linear cost of
``overhead_tokens`` tokens); a model with sliding-window or chunked layers adds their terms
(``ModelCost.windowed`` / ``chunked``; ``ModelCost.sequence_cost(L)`` sums them all). The
arithmetic is the planner's own (server/planner/model_cost.h), so ``packsched plan
--model_config`` gives the same weights.
"""

import json
import math
import os

from . import _planner

__all__ = ["ModelCost", "model_cost", "model_fields"]


def _fields_of(config, ints, strings):
    for key, value in config.items():
        if isinstance(value, bool) or value is None:
            # JSON's true / false / null, as the CLI's reader passes them.
            strings[key] = json.dumps(value)
            ints.pop(key, None)
        elif isinstance(value, int) and -(2**63) <= value < 2**63:
            ints[key] = value
            strings.pop(key, None)
        elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
            ints[key] = int(value)  # 4096.0: a whole number written as a real
            strings.pop(key, None)
        elif isinstance(value, (str, int, float)):
            # A string; or a real or an integer past int64, as its text: the planner refuses it
            # where it reads an integer.
            strings[key] = value if isinstance(value, str) else repr(value)
            ints.pop(key, None)
        elif isinstance(value, list) and (
            all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or all(isinstance(v, str) for v in value)
        ):
            # mlp_only_layers, no_rope_layers, layer_types: read as lists
            strings[key] = json.dumps(value)
            ints.pop(key, None)


def model_fields(config):
    """(integer fields, string fields) of a config: a dict, or the path of a config.json.

    Whole numbers written as reals (``4096.0``) are integers; other reals and lists of integers
    go as their text (the planner refuses a non-integer where it reads an integer, naming the
    field, and reads ``mlp_only_layers`` as a list). A vision-language model's ``text_config``
    describes its language model: its fields win over the top level's."""
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            config = json.load(f)
    if not isinstance(config, dict):
        raise TypeError(f"model_config must be a dict or a path, got {type(config).__name__}")
    ints, strings = {}, {}
    _fields_of(config, ints, strings)
    if isinstance(config.get("text_config"), dict):
        _fields_of(config["text_config"], ints, strings)
    return ints, strings


class ModelCost(tuple):
    """``(linear, quadratic, micro_batch)``, with the sliding-window and chunked layers' terms as
    attributes: ``windowed``, ``window``, ``chunked``, ``chunk`` (0 when the model has none) and
    ``shift`` (the FLOPs are the weights times 2**shift). ``sequence_cost(L)`` is the cost of one
    sequence of L tokens as the planner counts it."""

    def __new__(cls, linear, quadratic, micro_batch, shift, windowed, window, chunked, chunk):
        self = super().__new__(cls, (linear, quadratic, micro_batch))
        self.shift, self.windowed, self.window = shift, windowed, window
        self.chunked, self.chunk = chunked, chunk
        return self

    def __repr__(self):
        return (
            f"ModelCost(linear={self[0]}, quadratic={self[1]}, micro_batch={self[2]}, "
            f"windowed={self.windowed}, window={self.window}, chunked={self.chunked}, "
            f"chunk={self.chunk}, shift={self.shift})"
        )

    linear = property(lambda self: self[0])
    quadratic = property(lambda self: self[1])
    micro_batch = property(lambda self: self[2])

    def sequence_cost(self, length):
        """linear * L + quadratic * L^2 + windowed * Scores(L, window) + chunked * Chunks(L,
        chunk) (server/planner/options.h, AttentionCost)."""
        n = int(length)
        cost = self.linear * n + self.quadratic * n * n
        if self.windowed:
            w = self.window
            cost += self.windowed * (n * n if n <= w else w * w + (2 * w - 1) * (n - w))
        if self.chunked:
            c = self.chunk
            cost += self.chunked * ((n // c) * c * c + (n % c) ** 2)
        return cost


def model_cost(config, max_batch_tokens, longest, overhead_tokens=2048):
    """-> ModelCost ``(linear, quadratic, micro_batch)`` for ``config`` (dict or path of a
    config.json), scaled so that ``max_batch_tokens`` tokens in sequences of at most ``longest``
    cost at most 2^62; its ``windowed`` / ``window`` and ``chunked`` / ``chunk`` attributes hold
    the sliding-window and chunked layers' terms."""
    ints, strings = model_fields(config)
    try:
        out = _planner.model_cost(
            ints, strings, int(max_batch_tokens), int(longest), int(overhead_tokens)
        )
    except OverflowError as e:
        raise ValueError(f"model_config: a value does not fit in int64 ({e})") from e
    return ModelCost(*out)
