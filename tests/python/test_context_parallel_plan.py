"""Plan options context_parallel and tensor_parallel (in-process planner and the CLI's schema
path): align_to's default, the cap's meaning, the attention cost divided over the CP ranks,
nothing new at cp = 1, and each micro-batch's CP shard layout."""

import random

import pytest

from packsched import kernels, planner

LENGTHS = [random.Random(3).randint(1, 900) for _ in range(64)]
CAP = 2048


def test_context_parallel_1_changes_nothing():
    base = planner.plan_local(LENGTHS, CAP, align_to=8, cost="attention")
    same = planner.plan_local(
        LENGTHS, CAP, align_to=8, cost="attention", context_parallel=1, tensor_parallel=1
    )
    assert repr(base) == repr(same)


@pytest.mark.parametrize("cp,tp,align", [(2, 1, 4), (4, 1, 8), (2, 2, 8), (1, 2, 2), (1, 1, 1)])
def test_align_to_defaults_to_two_cp_tp(cp, tp, align):
    plan = planner.plan_local(LENGTHS, CAP, context_parallel=cp, tensor_parallel=tp)
    explicit = planner.plan_local(LENGTHS, CAP, align_to=align)
    assert plan.micro_batches == explicit.micro_batches
    for meta in plan.metadata:
        cu = meta.cu_seqlens_aligned
        lengths = [b - a for a, b in zip(cu, cu[1:])]
        assert all(n % align == 0 for n in lengths)
        # the cap holds for the whole micro-batch (one CP group), not per rank
        assert cu[-1] <= CAP


def test_an_explicit_align_to_must_be_a_multiple():
    with pytest.raises(ValueError, match="not a multiple of 8"):
        planner.plan_local(LENGTHS, CAP, align_to=4, context_parallel=2, tensor_parallel=2)
    plan = planner.plan_local(LENGTHS, CAP, align_to=16, context_parallel=2, tensor_parallel=2)
    assert all(
        (b - a) % 16 == 0
        for m in plan.metadata
        for a, b in zip(m.cu_seqlens_aligned, m.cu_seqlens_aligned[1:])
    )


def test_attention_cost_is_divided_over_the_cp_ranks():
    a, b = 100, 3
    full = planner.plan_local(LENGTHS, CAP, align_to=8, cost="attention", attention_cost=(a, b))
    sharded = planner.plan_local(
        LENGTHS, CAP, cost="attention", attention_cost=(a, b), context_parallel=4
    )
    assert full.micro_batches == sharded.micro_batches
    for m_full, m_cp in zip(full.metadata, sharded.metadata):
        cu = m_cp.cu_seqlens_aligned
        expected = sum((a * n + b * n * n) // 4 for n in (y - x for x, y in zip(cu, cu[1:])))
        assert m_cp.cost == expected
        assert m_full.cost == 4 * m_cp.cost


@pytest.mark.parametrize("cp", [2, 4])
def test_every_micro_batch_carries_each_ranks_shard_layout(cp):
    plan = planner.plan_local(LENGTHS, CAP, context_parallel=cp)
    for meta in plan.metadata:
        cu = meta.cu_seqlens_aligned
        covered = []
        for rank in range(cp):
            layout = kernels.cp_layout(cu, cp, rank)
            assert layout["rows"] * cp == cu[-1]
            assert layout["cu_seqlens_k"] == cu
            assert layout["cu_seqlens_q"] == [v // cp for v in cu]
            rows = [r for start, stop in layout["row_ranges"] for r in range(start, stop)]
            assert len(rows) == layout["rows"] == len(layout["positions"])
            covered += rows
        assert sorted(covered) == list(range(cu[-1]))  # the ranks partition the micro-batch


def test_bad_values_are_refused():
    with pytest.raises(ValueError):
        planner.plan_local(LENGTHS, CAP, context_parallel=0)
    with pytest.raises(ValueError):
        planner.plan_local(LENGTHS, CAP, tensor_parallel=-1)
