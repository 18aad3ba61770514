"""Dataset packing for TRL's ``SFTTrainer`` planned by packsched (tested with trl 1.16).

    from packsched.integrations.trl import pack_dataset
    packed = pack_dataset(dataset, seq_length=1024, strategy="balanced")
    SFTTrainer(model, args=SFTConfig(padding_free=True, max_length=None, ...), train_dataset=packed)

or, to keep TRL's own preparation (tokenising, labels) and swap only its packing step:

    import trl.trainer.sft_trainer
    trl.trainer.sft_trainer.pack_dataset = packsched.integrations.trl.pack_dataset

``pack_dataset`` takes and gives what ``trl.pack_dataset`` does: a ``datasets.Dataset`` (or a
``DatasetDict``, packed split by split) whose columns are all lists, one list per sequence, of
equal length across the columns of a row (``input_ids``, ``labels``, masks); each row of the
result is one packed row (a bin): every column holds its sequences' lists concatenated, and the
column ``seq_lengths`` lists their lengths, from which TRL's collator builds ``position_ids``
restarting at 0 per sequence (``padding_free=True``). As TRL's "bfd" strategy, a sequence longer
than ``seq_length`` is truncated to it and empty sequences are dropped.

Strategies (``strategy``):
  "bfd"       best fit decreasing (packsched's ``algorithm="bfd"``): TRL's "bfd" packing, the
              same rows (as sets of sequences): both visit the longest first (ties by position)
              and give each to the fullest row it fits, among equally full rows the one that
              reached that fill first.
  "balanced"  packsched's balanced packing (``algorithm="kk"``): the fewest rows packsched can
              prove fit ``seq_length`` (Karmarkar–Karp), with their ``cost`` balanced: "tokens"
              (equal token counts) or "attention" (packsched's attention cost per sequence).
Rows come in order of their first sequence, sequences inside a row in dataset order.

Differences from TRL: packsched plans the whole dataset (split) in one call, where TRL packs each
``Dataset.map`` batch (1,000 rows unless ``map_kwargs`` says otherwise) on its own, so beyond one
batch TRL's rows differ anyway; ``map_kwargs`` is accepted (SFTTrainer passes it) and unused.
Not offered: TRL's "bfd_split" and "wrapped" (ValueError), an ``IterableDataset`` (TypeError: the
plan needs every length). A column that is not a list raises TypeError; lists of unequal lengths
in one row raise ValueError, as in TRL.
"""

import numpy as np

from .. import planner

__all__ = ["pack_dataset", "STRATEGIES", "SEQ_LENGTHS"]

STRATEGIES = {"bfd": "bfd", "balanced": "kk"}  # strategy -> packsched planner algorithm
SEQ_LENGTHS = "seq_lengths"  # the column TRL's collator reads


def pack_dataset(dataset, seq_length, strategy="bfd", map_kwargs=None, *, cost="tokens"):
    """Packs ``dataset`` into rows of at most ``seq_length`` tokens (see the module docstring).
    -> a ``datasets.Dataset`` (``DatasetDict`` for a ``DatasetDict``) in TRL's packed format, with
    the input's format (its ``columns`` extended by "seq_lengths", as TRL does)."""
    from datasets import Dataset, DatasetDict

    del map_kwargs  # TRL's signature; the plan covers the whole split at once
    if strategy not in STRATEGIES:
        raise ValueError(
            f"packing strategy {strategy!r} is not one of {', '.join(STRATEGIES)} "
            "(TRL's 'bfd_split' and 'wrapped' are TRL's own: trl.pack_dataset)"
        )
    if isinstance(seq_length, bool) or not isinstance(seq_length, (int, np.integer)):
        raise TypeError(f"seq_length = {seq_length!r}: must be an integer")
    if seq_length < 1:
        raise ValueError(f"seq_length = {seq_length}: must be >= 1")
    if isinstance(dataset, DatasetDict):
        return DatasetDict(
            {
                name: pack_dataset(split, seq_length, strategy, cost=cost)
                for name, split in dataset.items()
            }
        )
    if not isinstance(dataset, Dataset):
        raise TypeError(
            f"pack_dataset takes a datasets.Dataset or DatasetDict, not {type(dataset).__name__} "
            "(packing plans over every sequence's length)"
        )
    form = dict(dataset.format)
    table = _pack_table(
        dataset.with_format("arrow")[:], int(seq_length), STRATEGIES[strategy], cost
    )
    packed = Dataset(table, split=dataset.split)
    columns = form.get("columns")
    if columns is not None:
        columns = list(columns) + [SEQ_LENGTHS]
    return packed.with_format(
        form.get("type"),
        columns=columns,
        output_all_columns=form.get("output_all_columns", False),
        **form.get("format_kwargs", {}),
    )


def _pack_table(table, seq_length, algorithm, cost):
    """The packed pyarrow Table of ``table`` (one row per sequence)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if SEQ_LENGTHS in table.column_names:
        raise ValueError(f"the dataset already has a {SEQ_LENGTHS!r} column: is it packed already?")
    columns = [table.column(name).combine_chunks() for name in table.column_names]
    if not columns:
        raise ValueError("pack_dataset: the dataset has no columns")
    lengths = None
    for name, column in zip(table.column_names, columns):
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            raise TypeError(f"packing needs list columns; {name!r} is {column.type}")
        own = pc.fill_null(pc.list_value_length(column), 0).to_numpy().astype(np.int64)
        if lengths is None:
            lengths = own
        elif not np.array_equal(own, lengths):
            row = int(np.flatnonzero(own != lengths)[0])
            raise ValueError(
                f"column {name!r} has {own[row]} values in row {row} where "
                f"{table.column_names[0]!r} has {lengths[row]}: a row's lists must be equally long"
            )
    lengths = np.minimum(lengths, seq_length)
    kept = np.flatnonzero(lengths > 0)
    bins = []
    if len(kept):
        plan = planner.plan_local(
            lengths[kept], seq_length, algorithm=algorithm, cost=cost, order="index", progress=False
        )
        bins = [[int(kept[i]) for i in part] for part in plan.micro_batches]
    rows = [row for part in bins for row in part]
    bin_tokens = np.array([lengths[part].sum() for part in bins], dtype=np.int64)
    packed = [_concatenate(column, rows, bin_tokens, seq_length) for column in columns]
    counts = np.array([len(part) for part in bins], dtype=np.int64)
    seq_lengths = pa.ListArray.from_arrays(
        np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
        pa.array(lengths[rows] if rows else [], type=pa.int32()),
    )
    return pa.Table.from_arrays(packed + [seq_lengths], names=table.column_names + [SEQ_LENGTHS])


def _concatenate(column, rows, bin_tokens, seq_length):
    """``column``'s lists truncated to ``seq_length``, taken in ``rows`` order and regrouped into
    one list per bin (``bin_tokens``: each bin's value count)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    taken = pc.list_slice(column, 0, seq_length).take(pa.array(rows, type=pa.int64()))
    offset_type = np.int64 if pa.types.is_large_list(column.type) else np.int32
    offsets = np.concatenate([[0], np.cumsum(bin_tokens)]).astype(offset_type)
    return type(column).from_arrays(offsets, taken.flatten())
