"""Row selection for verl's batches (packsched.compat.verl): the rows of a micro-batch, taken from
a tensor, a jagged nested tensor, a mapping of them, or a TensorDict as verl's trainer builds it.

verl's engine path (``verl.workers.engine``, padding-free) hands ``rearrange_micro_batches`` a
TensorDict holding jagged nested tensors (``input_ids``, ``position_ids``, ``loss_mask``; mRoPE
position ids are nested with the ragged dimension last), per-row non-tensor entries
(``NonTensorStack``) and batch-wide settings (``NonTensorData``: temperature, token caps, flags).
TensorDict's own row indexing refuses the nested tensors (``aten.index.Tensor`` is not
implemented for them), so each entry is taken here by kind.
"""

from collections.abc import Mapping

__all__ = ["take_rows", "jagged"]


def jagged():
    """torch's jagged nested layout, or None where this torch has none (before 2.2)."""
    import torch

    return getattr(torch, "jagged", None)


def take_rows(value, indices):
    """Rows ``indices`` (a list of ints, in that order) of ``value``:

    - a tensor: ``index_select`` on dim 0 (on its device);
    - a jagged nested tensor: a new jagged tensor of those rows, ragged in the same dimension
      (an empty selection gives a nested tensor of 0 rows);
    - a TensorDict: each entry taken by its kind (nested TensorDicts likewise); a
      ``NonTensorStack`` (one object per row) gives those rows' objects, a ``NonTensorData`` (one
      object for the batch) is kept for the new rows; the result has batch size [len(indices)]
      and the input's device. tensordict holds no empty ``NonTensorStack``: an empty selection of
      one raises ValueError naming its key;
    - another mapping (a dict of tensors): the same type with each value taken.
    """
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return _nested_rows(value, indices)
        index = torch.as_tensor(indices, dtype=torch.long, device=value.device)
        return value.index_select(0, index)
    if _is_tensordict(value):
        return _tensordict_rows(value, indices)
    if isinstance(value, Mapping):
        return type(value)({key: take_rows(item, indices) for key, item in value.items()})
    raise TypeError(f"cannot take rows of a {type(value).__name__}")


def _nested_rows(value, indices):
    """A jagged nested tensor's rows ``indices``, ragged in the same dimension as ``value``."""
    import torch

    if jagged() is None or value.layout != jagged():
        raise ValueError(
            "a nested tensor that is not jagged: packsched reads nested input only in torch's "
            f"jagged layout (torch >= 2.2; this is torch {torch.__version__})"
        )
    ragged = getattr(value, "_ragged_idx", 1)  # the ragged dimension of the nested tensor
    rows = value.unbind()
    picked = [rows[i] for i in indices]
    within = ragged - 1  # the same dimension in each row, and in the packed values
    values = value.values()
    values = torch.cat(picked, dim=within) if picked else values.narrow(within, 0, 0)
    lengths = [row.shape[within] for row in picked]
    offsets = torch.zeros(len(picked) + 1, dtype=torch.long, device=values.device)
    if picked:
        offsets[1:] = torch.cumsum(torch.as_tensor(lengths, device=values.device), dim=0)
    return torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=ragged)


def _is_tensordict(value):
    try:
        from tensordict import TensorDictBase
    except ImportError:
        return False
    return isinstance(value, TensorDictBase)


def _tensordict_rows(batch, indices):
    import torch
    from tensordict import TensorDict
    from tensordict.tensorclass import NonTensorData, NonTensorStack

    fields = {}
    for key in batch.keys():
        value = batch.get(key)
        if isinstance(value, NonTensorData):
            fields[key] = NonTensorData(data=value.data, batch_size=[len(indices)])
        elif isinstance(value, NonTensorStack):
            if not indices:
                raise ValueError(
                    f"an empty micro-batch of a TensorDict with the per-row non-tensor entry "
                    f"{key!r}: tensordict cannot hold an empty NonTensorStack"
                )
            fields[key] = value[torch.as_tensor(indices, dtype=torch.long)]
        else:
            fields[key] = take_rows(value, indices)
    return TensorDict(fields, batch_size=[len(indices)], device=batch.device)
