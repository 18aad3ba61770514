"""The planner's tree-packed layout is the reference builder's (helpers/tree_layout.py).

The tree-packing gradient proof (test_tree_gradient_equivalence.py) runs on the layout of the
planner's forest plan; this checks that layout against the reference written from the contract:
for every piece of every micro-batch that holds a whole tree, its rows (token ids, positions,
subtree ends, relative to the piece) and every rollout's rows are the reference's for that tree,
and every rollout of the forest is held exactly once.
"""

import pathlib
import sys

import numpy as np
import pytest

from packsched import planner

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "helpers"))

import tree_layout  # noqa: E402


def forests():
    rng = np.random.default_rng(11)
    yield "grpo", tree_layout.grpo_forest(
        rng, groups=5, n=8, prompt_len=(20, 120), completion_len=(1, 30)
    )
    yield "multiturn", tree_layout.multiturn_forest(rng, trees=7, depth=3, turn_len=(1, 25))


@pytest.mark.parametrize("shape,forest", list(forests()))
def test_planner_layout_is_the_reference_layout(shape, forest):
    roots = forest.roots()
    cap = max(forest.unique_tokens(root) for root in roots)  # every tree fits: one piece each
    tree_forest, rollouts = tree_layout.to_tree_forest(forest, roots)
    plan = planner.plan_local(tree_forest, cap)
    layouts = tree_layout.planner_layouts(tree_forest, rollouts, plan)
    assert len(layouts) >= 2, "the check needs trees in several micro-batches"

    held = []
    for mb, layout in zip(plan.micro_batches, layouts):
        cu = layout.cu
        for b in range(len(mb.piece_begin) - 1):
            root = int(mb.nodes[mb.piece_begin[b]])
            assert forest.node_parent[root] < 0, f"{shape}: piece {b} does not start at a root"
            expected = tree_layout.pack(forest, [root])
            a, end = cu[b], cu[b] + len(expected.ids)
            np.testing.assert_array_equal(layout.ids[a:end], expected.ids)
            np.testing.assert_array_equal(layout.positions[a:end], expected.positions)
            np.testing.assert_array_equal(
                np.asarray(layout.subtree_end[a:end]) - a, expected.subtree_end
            )
            for r, rows in zip(expected.rollouts, expected.rows):
                i = layout.rollouts.index(r)
                np.testing.assert_array_equal(layout.rows[i] - a, rows)
        for r, rows in zip(layout.rollouts, layout.rows):
            ids, _ = forest.rollout(r)
            np.testing.assert_array_equal(layout.ids[rows], ids)
        held.extend(layout.rollouts)
    assert sorted(held) == list(range(len(forest.rollout_leaf)))
