"""``Plan``: one rank's micro-batches, as the sidecar and the in-process planner return them.

All lengths are in tokens; indices are positions in the rank's batch as given (its "original
order"). A plan lists the kept sequences part after part (``reorder``), how to get back
(``revert``: for each original index its position in ``reorder``, or -1 if dropped), and the host
metadata each micro-batch needs to run without padding and without a device-to-host sync.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ._options import SCHEMA

__all__ = ["MicroBatchMeta", "PlanStats", "Plan", "TokenAccounting"]


_PYTHON_TYPES = {
    "Int": int,
    "Ints": list,
    "Bool": bool,
    "LossScale": float,
    "Double": float,
    "LocalK": int,
    "Cap": int,
    "Micros": float,
}


def _micro_batch_fields():
    # The schema's MicroBatch fields in proto order. The first (the micro-batch's indices) is
    # required; the other lists are prefix sums, [0] for no sequence; the planner's defaults for
    # the rest; loss_scale (float or None) is None without loss weights.
    out = []
    for i, f in enumerate(SCHEMA["micro_batch"]):
        kind = f["kind"]
        if i == 0:
            default = field()
        elif kind == "Ints":
            default = field(default_factory=lambda: [0])
        else:
            default = f["default"]
        out.append((f["name"], _PYTHON_TYPES[kind], default))
    return out


def _stats_fields():
    # The planner's figures (PlanStats' Int, Double and LocalK fields) in table order, then the
    # sidecar's: the cap (its alias) and the timings in milliseconds (alias_ms).
    planner = [
        (f["name"], _PYTHON_TYPES[f["kind"]], f["default"])
        for f in SCHEMA["plan_stats"]
        if f["kind"] in ("Int", "Double", "LocalK")
    ]
    wire = [
        (
            f["alias"] if f["kind"] == "Cap" else f"{f['alias']}_ms",
            _PYTHON_TYPES[f["kind"]],
            _PYTHON_TYPES[f["kind"]](f["default"]),
        )
        for f in SCHEMA["plan_stats"]
        if f["kind"] in ("Cap", "Micros")
    ]
    return planner + wire


def _schema_dataclass(fields):
    """Makes the decorated class a frozen dataclass whose fields are ``fields`` (name, type,
    default or dataclasses.field), in order: the schema table's, so a field added there appears
    here."""

    def make(cls):
        cls.__annotations__ = {name: kind for name, kind, _ in fields}
        for name, _, default in fields:
            setattr(cls, name, default)
        return dataclass(frozen=True)(cls)

    return make


@_schema_dataclass(_micro_batch_fields())
class MicroBatchMeta:
    """Host metadata of one micro-batch, in the order of its ``indices``: the fields of
    packsched.v1.MicroBatch.

    ``cu_seqlens`` / ``cu_seqlens_aligned``: int32-ranged prefix sums [B + 1] of the real and the
    aligned (``align_to``) lengths; ``total``: rows of the packed buffer (aligned tokens rounded up
    to ``align_total_to``; the rows past ``cu_seqlens_aligned[-1]`` are the tail: pass
    ``total=`` to packsched.kernels to build and use them; 0 for an empty micro-batch, see
    kernels/README.md for its all-tail dummy); ``max_seqlen``: the longest real length
    (FlashAttention's); ``cost``: the balancing cost; ``loss_scale``: the common loss weight of
    its sequences, NaN if they differ, 0 for an empty micro-batch (its dummy pass), None when the
    plan has no loss weights.
    """


_META_FIELDS = frozenset(f.name for f in fields(MicroBatchMeta))


def meta_of(values, *, adopt=False):
    """MicroBatchMeta of a dict holding every one of its fields (KeyError naming the first
    missing one, TypeError for one it does not have). A plan has thousands of micro-batches: this
    sets the frozen instance's fields at once instead of one object.__setattr__ each (the
    dataclass's __init__), about 8x faster; the instance is the same, and stays frozen. With
    ``adopt`` the dict itself becomes the instance's attributes (no copy): the caller must not
    keep using it."""
    if values.keys() != _META_FIELDS:
        missing = sorted(_META_FIELDS - values.keys())
        if missing:
            raise KeyError(f"MicroBatchMeta: no value for {missing[0]}")
        raise TypeError(f"MicroBatchMeta has no field {sorted(values.keys() - _META_FIELDS)[0]}")
    meta = object.__new__(MicroBatchMeta)
    if adopt:
        object.__setattr__(meta, "__dict__", values)
    else:
        meta.__dict__.update(values)
    return meta


@_schema_dataclass(_stats_fields())
class PlanStats:
    """Figures of one plan (the fields of packsched.v1.PlanStats and the planner's PlanStats).
    ``imbalance`` = largest cost / mean cost (1.0 is perfect); ``naive_padded_tokens`` is what a
    [num_kept, longest] padded batch would hold; timings are in milliseconds (0 for the
    in-process planner's wait)."""


@dataclass(frozen=True)
class TokenAccounting:
    """What a plan forwards, in tokens (docs/design.md "Token accounting").

    logical       the kept sequences' (rollouts') own lengths summed
    executed      rows forwarded: alignment padding and each micro-batch's tail included
    forwarded     real tokens forwarded: a tree's shared prefix once per piece that holds it
                  (= logical for sequences)
    loss_bearing  loss_tokens summed over the kept sequences (rollouts), 0 without loss_tokens
    """

    logical: int
    executed: int
    forwarded: int
    loss_bearing: int

    @property
    def tree_token_ratio(self):
        """forwarded / logical: below 1 when shared prefixes are forwarded once (1.0 when
        nothing is planned)."""
        return self.forwarded / self.logical if self.logical else 1.0


_LOSS_SCALE = next(f["name"] for f in SCHEMA["micro_batch"] if f["kind"] == "LossScale")
_LOCAL_K = next(f["name"] for f in SCHEMA["plan_stats"] if f["kind"] == "LocalK")
_INDEX_LISTS = [f["name"] for f in SCHEMA["plan_response"] if f["kind"] == "Indices"]
_WEIGHTS = next(f["name"] for f in SCHEMA["plan_response"] if f["kind"] == "Weights")
_INDICES = SCHEMA["micro_batch"][0]["name"]
_STATS_DEFAULTS = {f.name: f.default for f in fields(PlanStats)}


@dataclass(frozen=True)
class Plan:
    """One rank's plan.

    num_micro_batches        the agreed count (every rank of the round has this many)
    local_num_micro_batches  this rank's own bound before agreement
    micro_batches            list of lists of original indices (ascending inside each)
    metadata                 one MicroBatchMeta per micro-batch
    reorder, revert, dropped see the module docstring
    loss_weights             per original sequence (0 for dropped ones), or None without loss_tokens
    loss_scales              per micro-batch (see MicroBatchMeta.loss_scale), or None
    empty                    per micro-batch: True when it holds no sequence
    global_counts            (loss tokens, sequences with loss) summed over the round, or None
                             without loss_tokens (no weights, no counts)
    """

    num_micro_batches: int
    local_num_micro_batches: int
    micro_batches: list
    metadata: list
    reorder: list
    revert: list
    dropped: list
    loss_weights: list = None
    loss_scales: list = None
    empty: list = field(default_factory=list)
    stats: PlanStats = field(default_factory=PlanStats)
    global_counts: tuple = None

    @classmethod
    def from_raw(cls, raw, *, local_k=None, cap=0, global_counts=None):
        """Builds a Plan from the dict packsched._planner returns (taking over its lists and
        dicts)."""
        scales = raw.get("loss_scales")
        if scales is not None:
            for part, scale in zip(raw["parts"], scales):
                part[_LOSS_SCALE] = scale
        # The parts are dicts of every field, made for this plan alone: adopted, not copied.
        metadata = [meta_of(part, adopt=True) for part in raw["parts"]]
        stats = PlanStats(**raw["stats"], cap=cap or 0)
        return cls(
            num_micro_batches=len(metadata),
            local_num_micro_batches=getattr(stats, _LOCAL_K) if local_k is None else local_k,
            micro_batches=[m.indices for m in metadata],
            metadata=metadata,
            **{name: raw[name] for name in _INDEX_LISTS},
            loss_weights=raw.get(_WEIGHTS),
            loss_scales=scales,
            empty=[m.empty for m in metadata],
            stats=stats,
            global_counts=global_counts or raw.get("loss_counts"),
        )

    @property
    def tokens(self):
        """The plan's TokenAccounting."""
        s = self.stats
        return TokenAccounting(s.total_tokens, s.packed_tokens, s.forwarded_tokens, s.loss_tokens)

    @classmethod
    def from_columns(cls, columns, r=0, *, local_k=None, cap=0, global_counts=None):
        """Plan ``r`` of the numpy columns packsched._planner returns (plan_columns,
        balance_columns; client/python/src/plan_columns.h). Its counts and stats are read now;
        its lists (micro_batches, metadata, reorder, revert, dropped, empty) are built from the
        columns when first read, and are then the same lists a from_raw plan holds."""
        lists = lists_of(columns)
        stats = object.__new__(PlanStats)
        stats.__dict__.update(_STATS_DEFAULTS, cap=cap or 0)
        stats.__dict__.update({key: values[r] for key, values in lists["stats"].items()})
        parts = lists["plan_parts"]
        first, end = parts[r], parts[r + 1]
        plan = object.__new__(cls)
        plan.__dict__.update(
            num_micro_batches=end - first,
            local_num_micro_batches=getattr(stats, _LOCAL_K) if local_k is None else local_k,
            loss_weights=columns.get(_WEIGHTS),
            loss_scales=columns.get("loss_scales"),
            stats=stats,
            global_counts=global_counts or columns.get("loss_counts"),
            _columns=(lists, r, first, end, columns.get("loss_scales")),
        )
        return plan

    def __getattr__(self, name):
        # Only reached for an attribute the instance does not hold: a list of a from_columns plan
        # not read yet.
        build = _LAZY.get(name)
        lazy = self.__dict__.get("_columns")
        if build is None or lazy is None:
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")
        value = build(*lazy)
        self.__dict__[name] = value
        if all(key in self.__dict__ for key in _LAZY):
            del self.__dict__["_columns"]  # every list made: the columns can go
        return value

    def __getstate__(self):
        # A from_columns plan pickles as the plain plan it reads as, without the columns.
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def split(self, rows):
        """Splits row-indexed data into one piece per micro-batch, rows in each micro-batch's
        index order.

        ``rows``: a list or tuple, a numpy array or torch tensor indexed on dim 0, or a mapping
        of such (each value split; the pieces are dicts). Its length must be len(revert).
        """
        if isinstance(rows, Mapping):
            pieces = {key: self.split(value) for key, value in rows.items()}
            return [{key: pieces[key][i] for key in pieces} for i in range(len(self.micro_batches))]
        _check_rows(len(rows), len(self.revert), "rows")
        if isinstance(rows, (list, tuple)):
            return [[rows[i] for i in mb] for mb in self.micro_batches]
        return [_take(rows, mb) for mb in self.micro_batches]

    def restore(self, outputs, fill=None):
        """Puts per-micro-batch outputs back in original order: the inverse of ``split``.

        ``outputs``: one piece per micro-batch (lists, numpy arrays or torch tensors, rows in the
        micro-batch's index order; empty micro-batches give empty pieces). Dropped sequences get
        ``fill``: by default None for lists and 0 for arrays and tensors. Tensors keep autograd
        (the result is differentiable with respect to the pieces).
        """
        if len(outputs) != len(self.micro_batches):
            raise ValueError(
                f"restore: got {len(outputs)} outputs for {len(self.micro_batches)} micro-batches"
            )
        for i, (piece, mb) in enumerate(zip(outputs, self.micro_batches)):
            _check_rows(len(piece), len(mb), f"outputs[{i}]")
        n = len(self.revert)
        if all(isinstance(piece, (list, tuple)) for piece in outputs):
            flat = [row for piece in outputs for row in piece]
            return [fill if pos < 0 else flat[pos] for pos in self.revert]
        return _scatter(outputs, self.reorder, n, 0 if fill is None else fill)


class _Converted(dict):
    """The columns as Python lists, each converted when read; with ``keep``, converted once and
    kept."""

    def __init__(self, columns, keep):
        super().__init__()
        self._columns = columns
        self._keep = keep

    def __missing__(self, name):
        column = self._columns[name]
        value = (
            {key: values.tolist() for key, values in column.items()}
            if isinstance(column, dict)
            else column.tolist()
        )
        if self._keep:
            self[name] = value
        return value


def lists_of(columns):
    """The columns as Python lists (numpy arrays -> lists, the stats dict -> a dict of lists).
    With several plans (balance's ranks) they are converted once, in full, and kept with the
    columns: each plan's lists are then slices of them. A single plan's are converted field by
    field as it reads them, and not kept beyond the lists made from them."""
    if len(columns["plan_parts"]) <= 2:
        return _Converted(columns, keep=False)
    lists = columns.get("_lists")
    if lists is None:
        lists = columns["_lists"] = _Converted(columns, keep=True)
        for name, column in list(columns.items()):
            if name == "stats" or (name != "_lists" and hasattr(column, "tolist")):
                lists[name]  # noqa: B018 (converts)
    return lists


def _span(lists, name, r):
    """Plan r's slice of the index list ``name`` (reorder, revert, dropped)."""
    offsets = lists[name + "_offsets"]
    values = lists[name]
    if not lists._keep and offsets[r] == 0 and offsets[r + 1] == len(values):
        return values  # converted for this plan alone
    return values[offsets[r] : offsets[r + 1]]


def _lists(lists, name, first, end):
    """The lists ``name`` (indices, cu_seqlens, ...) of micro-batches [first, end)."""
    offsets = lists[name + "_offsets"]
    values = lists[name]
    return [values[offsets[i] : offsets[i + 1]] for i in range(first, end)]


def _metadata(lists, r, first, end, loss_scales):
    values = []
    for name, kind in _META_KINDS:
        if kind == "Ints":
            values.append(_lists(lists, name, first, end))
        elif kind == "LossScale":
            values.append([None] * (end - first) if loss_scales is None else list(loss_scales))
        else:
            values.append(lists[name][first:end])
    # Every field, by construction: meta_of's check is not needed.
    names = [name for name, _ in _META_KINDS]
    out = []
    for row in zip(*values):
        meta = object.__new__(MicroBatchMeta)
        object.__setattr__(meta, "__dict__", dict(zip(names, row)))
        out.append(meta)
    return out


_META_KINDS = [(f["name"], f["kind"]) for f in SCHEMA["micro_batch"]]
_LAZY = {
    "micro_batches": lambda lists, r, first, end, scales: _lists(lists, _INDICES, first, end),
    "metadata": _metadata,
    "empty": lambda lists, r, first, end, scales: lists["empty"][first:end],
    **{
        name: (lambda name: lambda lists, r, first, end, scales: _span(lists, name, r))(name)
        for name in _INDEX_LISTS
    },
}


def _check_rows(got, want, what):
    if got != want:
        raise ValueError(f"{what} has {got} rows, expected {want}")


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _take(rows, indices):
    if _is_torch(rows):
        import torch

        return rows.index_select(0, torch.as_tensor(indices, dtype=torch.long, device=rows.device))
    import numpy as np

    return rows[np.asarray(indices, dtype=np.int64)]


def _scatter(pieces, reorder, n, fill):
    # An empty micro-batch's piece may be a plain [] beside arrays or tensors: it holds no rows
    # (checked by the caller), so it is left out, and the first array or tensor decides the kind
    # (at least one exists: all-list outputs never get here).
    pieces = [p for p in pieces if len(p) > 0 or not isinstance(p, (list, tuple))]
    kind = next(p for p in pieces if not isinstance(p, (list, tuple)))
    if _is_torch(kind):
        import torch

        # Tensor pieces go in as they are (autograd flows through them); others are converted.
        cat = torch.cat(
            [
                p if _is_torch(p) else torch.as_tensor(p, dtype=kind.dtype, device=kind.device)
                for p in pieces
            ],
            dim=0,
        )
        out = torch.full((n,) + tuple(cat.shape[1:]), fill, dtype=cat.dtype, device=cat.device)
        index = torch.as_tensor(reorder, dtype=torch.long, device=cat.device)
        return out.index_copy(0, index, cat)
    import numpy as np

    cat = np.concatenate([np.asarray(p) for p in pieces], axis=0)
    out = np.full((n,) + cat.shape[1:], fill, dtype=cat.dtype)
    out[np.asarray(reorder, dtype=np.int64)] = cat
    return out
