"""packsched.compat.verl on verl's jagged batches, against verl's own functions (the installed
verl, verl.utils.seqlen_balancing) on the same batch.

verl reads the sequence lengths of a batch whose ``input_ids`` is a ``torch.nested`` jagged
tensor from its offsets (no attention mask) and splits every entry of the TensorDict (jagged
ones row by row, keeping their ragged dimension) or DataProto. The drop-in must do the same:
every micro-batch keeps the cap, holds exactly its rows of every entry, and keeps the jagged
layout; where packsched's plan and verl's are the same partition, the micro-batches are the same
(same rows, same order, same tensors).
"""

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict
from verl.protocol import DataProto
from verl.utils import seqlen_balancing as verl_module

import packsched.compat.verl as ours_module

HIDDEN = 3


def jagged(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def jagged_batch(lengths, seed=0):
    """A TensorDict as verl's padding-free path builds one: jagged input_ids and position_ids
    [B, j], a jagged [B, j, HIDDEN] float entry, a dense per-row tensor and a non-tensor entry."""
    generator = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, 1000, (n,), generator=generator) for n in lengths]
    hidden = [torch.randn(n, HIDDEN, generator=generator) for n in lengths]
    return TensorDict(
        {
            "input_ids": jagged(ids),
            "position_ids": jagged([torch.arange(n) for n in lengths]),
            "hidden": jagged(hidden),
            "score": torch.arange(len(lengths), dtype=torch.float32),
            "tag": NonTensorData("rollout"),
        },
        batch_size=[len(lengths)],
    )


def rows_of(value):
    return [row.clone() for row in value.unbind()]


def check_micro_batches(batch, micro_batches, idx, cap):
    """Every micro-batch: a TensorDict of exactly its rows of every entry, jagged entries jagged
    with the original ragged dimension, within the cap; every row in exactly one."""
    assert sorted(i for part in idx for i in part) == list(range(batch.batch_size[0]))
    original = {key: rows_of(batch[key]) for key in ("input_ids", "position_ids", "hidden")}
    for mb, part in zip(micro_batches, idx):
        assert isinstance(mb, TensorDict) and mb.batch_size[0] == len(part)
        for key, rows in original.items():
            value = mb[key]
            assert value.is_nested and value.layout == torch.jagged, key
            assert value._ragged_idx == batch[key]._ragged_idx, key
            got = value.unbind()
            assert len(got) == len(part)
            for row, i in zip(got, part):
                assert torch.equal(row, rows[i]), (key, i)
        assert mb["score"].tolist() == [float(i) for i in part]
        assert mb["tag"] == "rollout"
        tokens = int(mb["input_ids"].offsets().diff().sum()) if part else 0
        assert tokens <= cap


def same_micro_batch(a, b):
    for key in ("input_ids", "position_ids", "hidden"):
        assert a[key].layout == b[key].layout == torch.jagged
        assert a[key]._ragged_idx == b[key]._ragged_idx
        assert torch.equal(a[key].offsets(), b[key].offsets())
        assert torch.equal(a[key].values(), b[key].values())
    assert torch.equal(a["score"], b["score"])


def test_a_partition_both_must_find_gives_the_same_micro_batches_as_verl():
    # Cap 100 and 300 tokens: three micro-batches of exactly 100 each, and the only such split
    # pairs 80 + 20, 70 + 30, 60 + 40. verl's placement (largest work in the middle) applies.
    lengths = [60, 40, 70, 30, 80, 20]
    batch = jagged_batch(lengths)
    theirs, their_idx = verl_module.rearrange_micro_batches(batch, max_token_len=100)
    ours, our_idx = ours_module.rearrange_micro_batches(batch, max_token_len=100)
    check_micro_batches(batch, ours, our_idx, 100)
    assert our_idx == their_idx
    for a, b in zip(ours, theirs):
        same_micro_batch(a, b)


@pytest.mark.parametrize("seed", range(6))
def test_random_jagged_batches_keep_the_cap_and_match_verl_where_the_plans_agree(seed):
    rng = np.random.default_rng(seed)
    cap = 512
    lengths = [int(x) for x in rng.integers(1, cap + 1, size=int(rng.integers(4, 40)))]
    batch = jagged_batch(lengths, seed)
    theirs, their_idx = verl_module.rearrange_micro_batches(batch, max_token_len=cap)
    ours, our_idx = ours_module.rearrange_micro_batches(batch, max_token_len=cap)
    check_micro_batches(batch, ours, our_idx, cap)
    # The lengths packsched planned are verl's (from the offsets): as many micro-batches as the
    # tokens need at least, and never more rows than verl sees.
    assert len(ours) >= -(-sum(lengths) // cap)
    theirs_by_rows = {tuple(sorted(part)): mb for part, mb in zip(their_idx, theirs)}
    for part, mb in zip(our_idx, ours):
        if tuple(sorted(part)) in theirs_by_rows:
            same_micro_batch(mb, theirs_by_rows[tuple(sorted(part))])


def test_a_dataproto_with_jagged_tensors_splits_as_verls_prepare_dynamic_batch():
    lengths = [60, 40, 70, 30, 80, 20]
    batch = jagged_batch(lengths)
    data = DataProto.from_dict(
        tensors={key: batch[key] for key in ("input_ids", "position_ids", "hidden", "score")},
        non_tensors={"uid": np.array(list("abcdef"), dtype=object)},
        meta_info={"temperature": 0.7},
    )
    theirs, their_idx = verl_module.prepare_dynamic_batch(data, max_token_len=100)
    ours, our_idx = ours_module.prepare_dynamic_batch(data, max_token_len=100)
    assert our_idx == their_idx
    for a, b, part in zip(ours, theirs, our_idx):
        assert type(a) is DataProto
        same_micro_batch(a.batch, b.batch)
        assert a.non_tensor_batch["uid"].tolist() == ["abcdef"[i] for i in part]
        assert a.meta_info == {"temperature": 0.7}


def test_restoring_jagged_outputs_gives_verls_order_back():
    lengths = [5, 9, 3, 7, 4, 8]
    batch = jagged_batch(lengths)
    micro_batches, idx = ours_module.rearrange_micro_batches(batch, max_token_len=12)
    # Per-token outputs of the micro-batches, concatenated as a trainer does: [B, j, HIDDEN].
    flat = jagged([row for mb in micro_batches for row in mb["hidden"].unbind()])
    back = ours_module.restore_dynamic_batch(flat, idx)
    expected = verl_module.restore_dynamic_batch(flat, idx)
    assert back.layout == torch.jagged and back._ragged_idx == expected._ragged_idx
    assert torch.equal(back.offsets(), expected.offsets())
    assert torch.equal(back.values(), expected.values())
    assert torch.equal(back.values(), batch["hidden"].values())


def test_empty_micro_batches_of_a_jagged_batch_stay_jagged():
    # More micro-batches than rows (a rank with few sequences): the empty ones have zero rows of
    # every entry, jagged entries included (verl refuses this count instead).
    batch = jagged_batch([5, 9, 3])
    micro_batches, idx = ours_module.rearrange_micro_batches(
        batch, max_token_len=100, min_num_micro_batch=5
    )
    assert len(micro_batches) == 5 and sum(1 for part in idx if not part) == 2
    check_micro_batches(batch, micro_batches, idx, 100)
    for mb, part in zip(micro_batches, idx):
        if not part:
            assert mb["input_ids"].shape[0] == 0 and mb["hidden"].shape[-1] == HIDDEN
