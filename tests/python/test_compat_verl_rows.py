"""packsched.compat.verl on the batches of verl's padding-free engine: TensorDicts holding jagged
nested tensors (ragged in dim 1, or last for mRoPE position ids), per-row non-tensor entries and
batch-wide settings (packsched.compat._rows)."""

import pytest
import torch

tensordict = pytest.importorskip("tensordict")

from tensordict import TensorDict  # noqa: E402
from tensordict.tensorclass import NonTensorData, NonTensorStack  # noqa: E402

import packsched.compat.verl as seqlen_balancing  # noqa: E402
from packsched.compat._rows import take_rows  # noqa: E402

LENGTHS = [5, 2, 7, 1, 4, 6]


def engine_batch():
    """A batch shaped as verl's left_right_2_no_padding leaves it, plus mRoPE position ids."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 50, (n,), generator=g) for n in LENGTHS]
    mrope = [torch.randint(0, 9, (4, n), generator=g) for n in LENGTHS]
    values = torch.cat(mrope, dim=1)
    offsets = torch.tensor([0] + torch.tensor(LENGTHS).cumsum(0).tolist())
    return TensorDict(
        {
            "input_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
            "mrope": torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=2),
            "response_mask": torch.arange(len(LENGTHS) * 3).reshape(len(LENGTHS), 3),
            "uid": NonTensorStack.from_list([NonTensorData(f"u{i}") for i in range(len(LENGTHS))]),
            "temperature": NonTensorData(0.7, batch_size=[len(LENGTHS)]),
        },
        batch_size=[len(LENGTHS)],
    )


@pytest.mark.parametrize("indices", [[4, 0, 2], [5], list(range(len(LENGTHS)))])
def test_take_rows_takes_every_kind_of_entry(indices):
    batch = engine_batch()
    piece = take_rows(batch, indices)
    assert piece.batch_size == torch.Size([len(indices)])
    for key in ("input_ids", "mrope"):
        got, rows = piece[key].unbind(), batch[key].unbind()
        assert piece[key]._ragged_idx == batch[key]._ragged_idx
        assert [g.tolist() for g in got] == [rows[i].tolist() for i in indices]
    assert piece["response_mask"].tolist() == batch["response_mask"][indices].tolist()
    assert piece["uid"] == [f"u{i}" for i in indices]
    assert piece["temperature"] == 0.7


def test_rearrange_and_restore_round_trip_an_engine_batch():
    batch = engine_batch()
    micro_batches, indices = seqlen_balancing.rearrange_micro_batches(batch, max_token_len=8)
    assert sorted(i for part in indices for i in part) == list(range(len(LENGTHS)))
    for piece, part in zip(micro_batches, indices):
        assert int(piece["input_ids"].offsets()[-1]) == sum(LENGTHS[i] for i in part) <= 8
        assert piece["uid"] == [f"u{i}" for i in part]
    # Per-row outputs of the micro-batches, concatenated, come back in batch order.
    outputs = torch.nested.as_nested_tensor(
        [row for piece in micro_batches for row in piece["mrope"].unbind()], layout=torch.jagged
    )
    restored = seqlen_balancing.restore_dynamic_batch(outputs, indices)
    want = [row.tolist() for row in batch["mrope"].unbind()]
    assert [row.tolist() for row in restored.unbind()] == want


def test_empty_selections():
    batch = engine_batch()
    empty = take_rows(batch["input_ids"], [])
    assert empty.shape[0] == 0 and empty.is_nested
    with pytest.raises(ValueError, match="'uid'"):
        take_rows(batch, [])
    del batch["uid"]
    assert take_rows(batch, []).batch_size == torch.Size([0])
