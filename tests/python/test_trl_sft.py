"""TRL's SFTTrainer trained for real on the CPU with packsched's packing.

A tiny Qwen3 with random weights and a tokenizer built here (nothing downloaded) trains a few steps
on a pre-tokenized dataset: unpacked (padded rows, attention masks) and packed by
``packsched.integrations.trl.pack_dataset`` (TRL's padding-free format: one flattened row,
position_ids from ``seq_lengths``). Each step takes the whole dataset, so both runs see the same
tokens and their losses must agree to float32 rounding. Packed rows run under transformers' own
padding-free path (sdpa, whose mask is built from the position_ids) and under packsched's varlen
attention as the library registers it (``packsched.integrations.transformers``, "packsched_varlen").
The BFD check compares packsched's bins with ``trl.pack_dataset``'s own on random lengths.
"""

import os
import random
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")


from packsched.integrations.trl import pack_dataset  # noqa: E402

from packsched.integrations.transformers import VARLEN, register  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from hf_tiny_lm import tiny_model, tiny_tokenizer, VOCAB  # noqa: E402

# Losses of packed and unpacked runs of the same weights on the same tokens, float32: they differ
# only in the order of additions (attention over another layout, the loss summed in another order).
LOSS_TOLERANCE = 1e-5
SEQ_LENGTH = 64
STEPS = 3


def random_sequences(seed, count, longest):
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randint(2, longest))] for _ in range(count)]


# --- BFD: packsched's bins against TRL's ---------------------------------------------------------


def bins_of(packed):
    """Each packed row's sequence ids (the dataset's sequences are [id] * length)."""
    rows = []
    for ids, seq_lengths in zip(packed["input_ids"], packed["seq_lengths"]):
        members, start = [], 0
        for length in seq_lengths:
            piece = ids[start : start + length]
            assert piece == [piece[0]] * length  # whole sequences, never mixed
            members.append(piece[0])
            start += length
        assert start == len(ids)
        rows.append(members)
    return rows


def test_bfd_makes_trls_bins():
    tied_runs = 0
    for trial in range(60):
        rng = random.Random(trial)
        cap = rng.choice([8, 32, 100, 512])
        # Some sequences longer than the cap: both truncate them to it.
        lengths = [rng.randint(1, cap + cap // 4) for _ in range(rng.randint(1, 400))]
        data = datasets.Dataset.from_dict({"input_ids": [[i] * n for i, n in enumerate(lengths)]})
        ours = bins_of(pack_dataset(data, cap, "bfd"))
        theirs = bins_of(trl.pack_dataset(data, cap, "bfd"))
        assert sorted(s for row in ours for s in row) == list(range(len(lengths)))
        # The same rows (as sets of sequences): where several rows are equally full, both give
        # the sequence to the row that reached that fill first.
        assert sorted(map(sorted, ours)) == sorted(map(sorted, theirs))
        tied_runs += had_equally_full_rows(theirs, [min(n, cap) for n in lengths])
    # Ties occurred, so the rule that breaks them was exercised.
    assert tied_runs > 0


def had_equally_full_rows(bins, lengths):
    """Whether filling ``bins`` longest sequence first (ties by position) ever put a sequence into
    a row while another row was exactly as full."""
    row_of = {seq: row for row, members in enumerate(bins) for seq in members}
    fill = [0] * len(bins)
    for seq in sorted(row_of, key=lambda s: (-lengths[s], s)):
        row = row_of[seq]
        if fill[row] and sum(f == fill[row] for f in fill) > 1:
            return True
        fill[row] += lengths[seq]
    return False


def test_balanced_rows_fit_and_are_no_more_than_bfds():
    for trial in range(20):
        rng = random.Random(100 + trial)
        lengths = [rng.randint(1, 200) for _ in range(rng.randint(1, 300))]
        data = datasets.Dataset.from_dict({"input_ids": [[i] * n for i, n in enumerate(lengths)]})
        balanced = pack_dataset(data, 256, "balanced")
        rows = bins_of(balanced)
        assert sorted(s for row in rows for s in row) == list(range(len(lengths)))
        loads = [sum(lengths[s] for s in row) for row in rows]
        assert max(loads) <= 256
        assert len(rows) <= len(pack_dataset(data, 256, "bfd"))
        assert max(loads) <= -(-sum(lengths) // len(rows)) + max(lengths)


def test_pack_dataset_keeps_trls_contract():
    rows = {
        "input_ids": [[5, 6, 7], [8], [], [9, 10, 11, 12, 13]],
        "labels": [[1, 2, 3], [4], [], [5] * 5],
    }
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(rows).with_format("torch"),
            "test": datasets.Dataset.from_dict(rows),
        }
    )
    packed = pack_dataset(splits, 4, "balanced")
    assert packed["train"].format["type"] == "torch"
    assert packed["train"].format["columns"] == ["input_ids", "labels", "seq_lengths"]
    for split in packed.values():
        # The empty row is dropped, the 5-token one truncated to 4, labels travel with their ids.
        assert sorted(sum(split.with_format(None)["seq_lengths"], [])) == [1, 3, 4]
        for row in split.with_format(None):
            assert len(row["input_ids"]) == len(row["labels"]) == sum(row["seq_lengths"]) <= 4
    with pytest.raises(ValueError, match="wrapped"):
        pack_dataset(splits["test"], 4, "wrapped")
    with pytest.raises(TypeError, match="'n'"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [[1]], "n": [1]}), 4)
    with pytest.raises(ValueError, match="'labels'"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [[1, 2]], "labels": [[1]]}), 4)


# --- SFTTrainer: packed runs against the unpacked run -------------------------------------------


def sft_losses(tmp_path, dataset, attention, **config):
    """The logged loss of each of STEPS steps of SFTTrainer from the same initial weights, each
    step over the whole dataset (one batch)."""
    args = trl.SFTConfig(
        output_dir=str(tmp_path / attention),
        max_steps=STEPS,
        per_device_train_batch_size=len(dataset),
        optim="sgd",
        learning_rate=0.5,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        gradient_checkpointing=False,
        bf16=False,  # TRL's default is bf16 autocast, also on the CPU: float32 here
        dataloader_num_workers=0,
        **config,
    )
    trainer = trl.SFTTrainer(
        model=tiny_model(attention),
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer(),
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == STEPS
    return losses, trainer


@pytest.fixture(scope="module")
def sequences():
    return datasets.Dataset.from_dict({"input_ids": random_sequences(7, 24, 40)})


@pytest.fixture(scope="module")
def unpacked_losses(sequences, tmp_path_factory):
    losses, _ = sft_losses(tmp_path_factory.mktemp("unpacked"), sequences, "sdpa", max_length=None)
    return losses


@pytest.mark.parametrize("attention", ["sdpa", VARLEN])
@pytest.mark.parametrize("strategy", ["bfd", "balanced"])
def test_padding_free_training_matches_unpacked(
    sequences, unpacked_losses, tmp_path, strategy, attention
):
    register()
    packed = pack_dataset(sequences, SEQ_LENGTH, strategy)
    assert len(packed) < len(sequences)  # rows were really shared
    losses, trainer = sft_losses(tmp_path, packed, attention, padding_free=True, max_length=None)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch  # padding-free
    assert batch["position_ids"].eq(0).sum() == len(sequences)  # one start per sequence
    assert all(a == a for a in losses)  # finite
    assert losses == pytest.approx(unpacked_losses, abs=LOSS_TOLERANCE)


def test_sft_trainer_packs_through_packsched_when_swapped(
    sequences, unpacked_losses, tmp_path, monkeypatch
):
    """The one-line swap: TRL prepares the dataset as usual and packs it with packsched."""
    calls = []

    def spy(dataset, seq_length, strategy="bfd", map_kwargs=None):
        calls.append((len(dataset), seq_length, strategy))
        return pack_dataset(dataset, seq_length, strategy, map_kwargs)

    monkeypatch.setattr(trl.trainer.sft_trainer, "pack_dataset", spy)
    losses, trainer = sft_losses(
        tmp_path, sequences, "sdpa", packing=True, packing_strategy="bfd", max_length=SEQ_LENGTH
    )
    assert calls == [(len(sequences), SEQ_LENGTH, "bfd")]
    expected = pack_dataset(sequences, SEQ_LENGTH, "bfd")
    assert trainer.train_dataset["seq_lengths"] == expected["seq_lengths"]
    assert trainer.train_dataset["input_ids"] == expected["input_ids"]
    assert losses == pytest.approx(unpacked_losses, abs=LOSS_TOLERANCE)
