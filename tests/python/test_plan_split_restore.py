"""Plan.split / Plan.restore: round trips for lists, numpy arrays and torch tensors."""

import numpy as np
import pytest
import torch

from packsched import planner

LENGTHS = [30, 150, 40, 70, 10, 99, 5]


@pytest.fixture
def plan():
    return planner.plan_local(LENGTHS, 100, overlong="drop")


def test_split_follows_the_micro_batches(plan):
    rows = np.arange(len(LENGTHS)) * 10
    pieces = plan.split(rows)
    assert [piece.tolist() for piece in pieces] == [
        [i * 10 for i in mb] for mb in plan.micro_batches
    ]


@pytest.mark.parametrize("kind", ["list", "numpy", "torch"])
def test_restore_inverts_split_and_fills_dropped_rows(plan, kind):
    data = {
        "list": [f"row{i}" for i in range(len(LENGTHS))],
        "numpy": np.arange(len(LENGTHS) * 3, dtype=np.float64).reshape(-1, 3) + 1,
        "torch": torch.arange(len(LENGTHS) * 3, dtype=torch.float32).reshape(-1, 3) + 1,
    }[kind]
    restored = plan.restore(plan.split(data))
    for i in range(len(LENGTHS)):
        if i in plan.dropped:
            assert restored[i] is None if kind == "list" else (restored[i] == 0).all()
        elif kind == "list":
            assert restored[i] == data[i]
        else:
            assert (restored[i] == data[i]).all()
    filled = plan.restore(plan.split(data), fill=-1)
    assert all(
        (filled[i] == -1) if kind == "list" else (filled[i] == -1).all() for i in plan.dropped
    )


def test_split_of_a_mapping_splits_every_entry(plan):
    batch = {"ids": torch.arange(len(LENGTHS)), "mask": np.ones((len(LENGTHS), 2))}
    pieces = plan.split(batch)
    assert len(pieces) == plan.num_micro_batches
    for piece, mb in zip(pieces, plan.micro_batches):
        assert piece["ids"].tolist() == mb
        assert piece["mask"].shape == (len(mb), 2)


def test_restore_keeps_autograd(plan):
    x = torch.randn(len(LENGTHS), 2, requires_grad=True)
    restored = plan.restore([piece * 2 for piece in plan.split(x)])
    restored.sum().backward()
    expected = torch.full_like(x, 2.0)
    expected[plan.dropped] = 0.0
    assert torch.equal(x.grad, expected)


def test_wrong_sizes_are_value_errors(plan):
    with pytest.raises(ValueError, match="rows has 3 rows"):
        plan.split([1, 2, 3])
    with pytest.raises(ValueError, match="outputs"):
        plan.restore([[]])
    pieces = plan.split(list(range(len(LENGTHS))))
    pieces[0] = pieces[0] + [99]
    with pytest.raises(ValueError, match=r"outputs\[0\]"):
        plan.restore(pieces)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_an_empty_micro_batch_may_give_a_plain_empty_list(kind):
    # k = 3 for two sequences: one micro-batch is empty, and a trainer hands back [] for it.
    plan = planner.partition([30, 40], 3, 100)
    empty = [i for i, mb in enumerate(plan.micro_batches) if not mb]
    assert empty
    make = {
        "numpy": lambda rows: np.asarray(rows, dtype=np.float64),
        "torch": lambda rows: torch.tensor(rows, dtype=torch.float32, requires_grad=True),
    }[kind]
    leaves = [None] * len(plan.micro_batches)
    pieces = []
    for i, mb in enumerate(plan.micro_batches):
        if not mb:
            pieces.append([])
            continue
        leaves[i] = make([[float(j), float(j) + 0.5] for j in mb])
        pieces.append(leaves[i])
    restored = plan.restore(pieces)
    assert restored.shape == (2, 2)
    for j in range(2):
        assert [float(x) for x in restored[j]] == [float(j), float(j) + 0.5]
    if kind == "torch":  # the tensors keep autograd beside the plain []
        restored.sum().backward()
        assert all(leaf.grad is not None for leaf in leaves if leaf is not None)
