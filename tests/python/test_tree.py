"""packsched.tree and the in-process plan over forests: tries from token ids, forests from group
lengths, bad forests named, and tree plans whose rows give back every rollout."""

import numpy as np
import pytest

from packsched import _planner, planner
from packsched._options import split_options
from packsched.tree import Forest, build_forest, forest_from_groups


def random_rollouts(rng, groups=4, per_group=6, vocab=3):
    """Rollouts with shared prefixes: each group's members extend a few common stems."""
    rollouts, gids = [], []
    for g in range(groups):
        stems = [list(rng.integers(0, vocab, rng.integers(1, 12))) for _ in range(2)]
        for _ in range(per_group):
            stem = stems[rng.integers(0, 2)]
            cut = int(rng.integers(1, len(stem) + 1))
            tail = list(rng.integers(0, vocab, rng.integers(0, 6)))
            rollouts.append(stem[:cut] + tail)
            gids.append(g * 7 % 5)  # groups 0, 2, 4, 1: not in order of first appearance
    return rollouts, gids


def test_build_forest_is_the_trie_of_each_group():
    rng = np.random.default_rng(0)
    for _ in range(30):
        rollouts, gids = random_rollouts(rng)
        forest = build_forest(rollouts, gids)
        forest.check_rollouts(rollouts)
        # A trie holds one token per distinct non-empty prefix of its group.
        prefixes = {(g, tuple(r[: i + 1])) for r, g in zip(rollouts, gids) for i in range(len(r))}
        assert forest.unique_tokens == len(prefixes)
        assert forest.rollout_tokens == sum(len(r) for r in rollouts)
        # Maximal runs: a node with one child is some rollout's end.
        children = np.bincount(
            forest.node_parent[forest.node_parent >= 0], minlength=forest.num_nodes
        )
        ends = set(forest.rollout_leaf.tolist())
        for n in np.flatnonzero(children == 1):
            assert n in ends
        # Preorder: every subtree is a contiguous range of ids after its root.
        assert np.all(forest.node_parent < np.arange(forest.num_nodes))
        again = build_forest(rollouts, gids)
        assert np.array_equal(again.node_len, forest.node_len)
        assert np.array_equal(again.node_parent, forest.node_parent)
        assert np.array_equal(again.rollout_leaf, forest.rollout_leaf)


def test_build_forest_keeps_groups_apart_and_names_an_empty_rollout():
    same = [[1, 2, 3], [1, 2, 3]]
    assert build_forest(same).num_nodes == 1
    assert build_forest(same, group_ids=[0, 1]).num_nodes == 2
    with pytest.raises(ValueError, match="rollout 1 has no tokens"):
        build_forest([[1], []])
    forest = build_forest([[5, 6], [5, 7]])
    with pytest.raises(ValueError, match="rollout 1's tokens do not match"):
        forest.check_rollouts([[5, 6], [5, 8]])


def test_forest_from_groups():
    forest = forest_from_groups([100, 30], [[10, 0, 20], [5]])
    assert forest.node_len.tolist() == [100, 10, 20, 30, 5]
    assert forest.node_parent.tolist() == [-1, 0, 0, -1, 3]
    assert forest.rollout_leaf.tolist() == [1, 0, 2, 4]
    assert forest.rollout_len.tolist() == [110, 100, 120, 35]


@pytest.mark.parametrize(
    "node_len, node_parent, leaf, message",
    [
        ([4, 0], [-1, 0], [1], "node 1 has node_len = 0"),
        ([4, 3], [-1, 7], [1], "node 1 has node_parent = 7"),
        ([4, 3, 2], [-1, 2, 0], [1, 2], "node 1 has node_parent = 2"),
        ([4, 3], [1, 0], [1], "node 0 has node_parent = 1"),
        ([4, 3], [-1, 0], [2], "rollout 0 has rollout_leaf = 2"),
        ([4, 3, 1], [-1, 0, 0], [1], "node 2 is on no rollout"),
    ],
)
def test_bad_forest_names_the_node_or_rollout(node_len, node_parent, leaf, message):
    with pytest.raises(ValueError, match=message):
        Forest(np.array(node_len), np.array(node_parent), np.array(leaf))
    # The planner checks the same on its own (the sidecar's and the CLI's path).
    options, _ = split_options(64, {}, where="test", cap_required=True)
    with pytest.raises(ValueError, match=message):
        _planner.forest_plan(
            np.array(node_len), np.array(node_parent), np.array(leaf), None, options
        )


def check_plan(forest, rollouts, plan, cap):
    seen = np.zeros(forest.num_rollouts, dtype=int)
    for i, mb in enumerate(plan.micro_batches):
        ids = mb.input_ids(forest, pad=-1)
        position, subtree_end = mb.rows(forest)
        if not mb.meta.overlong:
            assert mb.meta.total <= cap
        for j, r in enumerate(mb.rollouts.tolist()):
            rows = mb.rollout_rows(forest, j)
            assert ids[rows].tolist() == list(rollouts[r])
            assert position[rows].tolist() == list(range(len(rows)))
            # The mask rule over the rollout's own rows is causal.
            vis = (rows[None, :] <= rows[:, None]) & (rows[:, None] < subtree_end[rows][None, :])
            assert np.array_equal(vis, np.tril(np.ones((len(rows), len(rows)), dtype=bool)))
            assert plan.rollout_part[r] == i
            seen[r] += 1
    dropped = np.zeros(forest.num_rollouts, dtype=int)
    dropped[plan.dropped] = 1
    assert np.array_equal(seen + dropped, np.ones(forest.num_rollouts, dtype=int))


@pytest.mark.parametrize("cap, align_to", [(64, 1), (40, 1), (64, 8), (24, 4)])
def test_plan_local_with_a_forest(cap, align_to):
    rng = np.random.default_rng(cap + align_to)
    rollouts, gids = random_rollouts(rng, groups=6, vocab=2)
    forest = build_forest(rollouts, gids)
    plan = planner.plan_local(forest, cap, align_to=align_to, overlong="isolate")
    check_plan(forest, rollouts, plan, cap)
    flat = planner.plan_local(forest.rollout_len, cap, align_to=align_to, overlong="isolate")
    assert plan.num_micro_batches <= flat.num_micro_batches
    assert plan.forwarded_tokens <= plan.rollout_tokens == forest.rollout_tokens


@pytest.mark.parametrize("mode", ["token_mean", "sample_mean", "seq_sum", "sum", "sum_norm"])
def test_loss_weights_are_the_flat_ones_per_rollout(mode):
    forest = forest_from_groups([30, 12, 50], [[4, 9, 1], [7, 7], [3]])
    loss_tokens = [4, 9, 0, 7, 6, 3]
    tree = planner.plan_local(forest, 64, loss_tokens=loss_tokens, loss_mode=mode)
    flat = planner.plan_local(forest.rollout_len, 64, loss_tokens=loss_tokens, loss_mode=mode)
    assert np.allclose(tree.loss_weights, flat.loss_weights)
    assert tree.global_counts == flat.global_counts


def test_over_cap_tree_splits_and_overlong_policies():
    forest = forest_from_groups([100], [[50, 150, 20, 60]])
    rollouts = [list(range(int(n))) for n in forest.rollout_len]  # token = its position
    forest = Forest(forest.node_len, forest.node_parent, forest.rollout_leaf)
    with pytest.raises(ValueError, match="rollout 1 has length 250"):
        planner.plan_local(forest, 200)
    dropped = planner.plan_local(forest, 200, overlong="drop")
    assert dropped.dropped == [1]
    isolated = planner.plan_local(forest, 200, overlong="isolate")
    assert isolated.dropped == []
    assert sum(mb.meta.overlong for mb in isolated.micro_batches) == 1
    for plan in (dropped, isolated):
        for mb in plan.micro_batches:
            position, _ = mb.rows(forest)
            for j in range(len(mb.rollouts)):
                rows = mb.rollout_rows(forest, j)
                assert position[rows].tolist() == rollouts[mb.rollouts[j]]


def random_forest(rng, nodes):
    parent = [-1] + [
        int(rng.integers(-1, i)) if rng.random() > 0.2 else -1 for i in range(1, nodes)
    ]
    inner = {p for p in parent if p >= 0}
    leaves = [i for i in range(nodes) if i not in inner or rng.random() < 0.2]
    return Forest(rng.integers(1, 80, nodes), parent, leaves)


@pytest.mark.parametrize("overlong", ["isolate", "drop"])
def test_forwarded_lower_bound_is_a_floor_under_every_plan(overlong):
    rng = np.random.default_rng(9)
    for trial in range(60):
        forest = random_forest(rng, int(rng.integers(1, 40)))
        cap = int(rng.integers(60, 400))
        align_to = (1, 2, 8)[trial % 3]
        plan = planner.plan_local(forest, cap, align_to=align_to, overlong=overlong)
        bound = forest.forwarded_lower_bound(cap, align_to=align_to, overlong=overlong)
        assert bound <= plan.forwarded_tokens
        if overlong == "drop" and not plan.dropped:
            assert bound >= forest.unique_tokens
    # Every tree within the cap: the bound is the unique tokens, which the plan forwards.
    forest = random_forest(rng, 30)
    assert forest.forwarded_lower_bound(forest.unique_tokens) == forest.unique_tokens


def test_forwarded_lower_bound_is_reached_by_a_split_group():
    # A 100-token prompt and 4 x 50 under 220: no piece holds more than 2 completions (each
    # repeats the prompt), and no fewer than 2 pieces hold 200 completion tokens.
    forest = forest_from_groups([100], [[50, 50, 50, 50]])
    assert forest.forwarded_lower_bound(220) == 400
    assert planner.plan_local(forest, 220).forwarded_tokens == 400
    # Completions over half of the room cannot share a piece: 3 x 70 with 120 free need 3.
    forest = forest_from_groups([100], [[70, 70, 70]])
    assert forest.forwarded_lower_bound(220) == 3 * 100 + 210
    assert planner.plan_local(forest, 220).forwarded_tokens == 510
    # A rollout over the cap: forwarded alone, or not at all.
    forest = forest_from_groups([100], [[50, 150]])
    assert forest.forwarded_lower_bound(200, overlong="isolate") == 150 + 250
    assert forest.forwarded_lower_bound(200, overlong="drop") == 150
    with pytest.raises(ValueError, match="overlong"):
        forest.forwarded_lower_bound(200, overlong="error")


def test_agreement_and_balance_over_forests():
    rng = np.random.default_rng(5)
    forests = []
    for _ in range(2):
        rollouts, gids = random_rollouts(rng, groups=5)
        forests.append(build_forest(rollouts, gids))
    bounds = [
        planner.local_bound(f, 24, overlong="isolate", loss_tokens=f.rollout_len) for f in forests
    ]
    k = max(b.k for b in bounds)
    counts = tuple(sum(b.loss_counts[i] for b in bounds) for i in range(2))
    for f in forests:
        plan = planner.partition(
            f,
            k,
            24,
            overlong="isolate",
            loss_tokens=f.rollout_len,
            global_counts=counts,
            world_size=2,
        )
        assert plan.num_micro_batches == k
        assert plan.global_counts == counts
    balanced = planner.balance(forests[0], 3, 24, overlong="isolate", sync="micro_batch")
    seen = []
    for rank in balanced.ranks:
        assert rank.plan.num_micro_batches == balanced.num_micro_batches
        for mb in rank.plan.micro_batches:
            seen.extend(mb.rollouts.tolist())
    assert sorted(seen) == list(range(forests[0].num_rollouts))


def test_restore_gathers_each_rollouts_rows():
    rollouts = [[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6, 7], [8]]
    forest = build_forest(rollouts)
    plan = planner.plan_local(forest, 16)
    outputs = [mb.input_ids(forest).astype(float) * 10 for mb in plan.micro_batches]
    restored = plan.restore(forest, outputs)
    for r, tokens in enumerate(rollouts):
        assert restored[r].tolist() == [10.0 * t for t in tokens]


def test_context_parallel_aligns_every_piece_for_its_shards():
    forest = forest_from_groups([10, 7], [[5, 3], [9]])
    plan = planner.plan_local(forest, 64, context_parallel=2)
    for part in plan.micro_batches:
        cu = list(part.meta.cu_seqlens_aligned)
        assert all(b - a > 0 and (b - a) % 4 == 0 for a, b in zip(cu, cu[1:]))
        positions, subtree_end = part.rows(forest)
        assert len(positions) == part.meta.total
    flat = planner.plan_local(forest, 64)
    assert sum(p.meta.tokens for p in plan.micro_batches) == sum(
        p.meta.tokens for p in flat.micro_batches
    )


def test_layout_is_linear_and_its_rows_are_derived_from_the_forest():
    # A trunk with a rollout at every node, the deep ones isolated: their pieces repeat the
    # trunk (about n^2 / 2 node occurrences), the plan keeps one value per rollout and piece.
    n, cap = 300, 48
    forest = Forest(np.ones(n, dtype=np.int64), np.arange(n) - 1, np.arange(n))
    rollouts = [list(range(r + 1)) for r in range(n)]
    plan = planner.plan_local(forest, cap, overlong="isolate")
    stored = sum(
        len(mb.rollouts) + len(mb.piece_rollouts) + len(mb.piece_rollout_begin)
        for mb in plan.micro_batches
    )
    assert stored <= 4 * n
    assert sum(len(mb.nodes) for mb in plan.micro_batches) > n * (n - cap) // 2
    tokens = Forest(forest.node_len, forest.node_parent, forest.rollout_leaf, np.arange(n))
    check_plan(tokens, rollouts, plan, cap)


def test_layout_needs_its_forest_and_checks_its_arrays():
    forest = forest_from_groups([5], [[3, 4]])
    mb = planner.plan_local(forest, 64).micro_batches[0]
    bare = type(mb)(mb.meta, mb.rollouts, mb.piece_rollouts, mb.piece_rollout_begin)
    with pytest.raises(ValueError, match="no forest"):
        bare.rows()
    assert np.array_equal(bare.rows(forest)[0], mb.rows()[0])
    bad = type(mb)(mb.meta, mb.rollouts, mb.piece_rollouts + 5, mb.piece_rollout_begin, forest)
    with pytest.raises(ValueError, match="is not a rollout of the forest"):
        bad.entries()
    short = type(mb)(mb.meta, mb.rollouts, mb.piece_rollouts, mb.piece_rollout_begin[:1], forest)
    with pytest.raises(ValueError, match="piece_rollout_begin"):
        short.rows()


def test_token_accounting_of_flat_and_tree_plans():
    rng = np.random.default_rng(11)
    forest = forest_from_groups(rng.integers(100, 900, 5), [rng.integers(1, 300, 6)] * 5)
    loss = rng.integers(0, 50, forest.num_rollouts).tolist()
    tree = planner.plan_local(forest, 1024, align_to=8, loss_tokens=loss)
    t = tree.tokens
    assert t.logical == forest.rollout_tokens
    assert (
        t.forwarded
        == tree.forwarded_tokens
        == sum(int(forest.node_len[mb.nodes].sum()) for mb in tree.micro_batches)
    )
    assert t.executed == sum(mb.meta.total for mb in tree.micro_batches) > t.forwarded
    assert t.loss_bearing == sum(loss)
    assert t.tree_token_ratio == t.forwarded / t.logical < 1
    flat = planner.plan_local(forest.rollout_len, 1024, align_to=8)
    f = flat.tokens
    assert f.logical == f.forwarded == forest.rollout_tokens
    assert f.executed == sum(m.total for m in flat.metadata)
    assert f.loss_bearing == 0  # no loss_tokens given
    assert f.tree_token_ratio == 1.0


@pytest.mark.parametrize("trees", [1, 3, 7])
@pytest.mark.parametrize("sync", ["step", "micro_batch"])
def test_balance_gives_every_rank_a_piece_at_world_8(trees, sync):
    rng = np.random.default_rng(trees)
    forest = forest_from_groups(
        rng.integers(1000, 3001, trees), [rng.integers(200, 1501, 16) for _ in range(trees)]
    )
    for cap in (65536, 8192):  # trees whole, and trees over the cap
        balanced = planner.balance(forest, 8, cap, sync=sync, min_micro_batches=3, divisible_by=2)
        assert balanced.num_micro_batches >= 3 and balanced.num_micro_batches % 2 == 0
        seen = []
        for rank in balanced.ranks:
            assert rank.plan.num_micro_batches == balanced.num_micro_batches
            held = [r for mb in rank.plan.micro_batches for r in mb.rollouts.tolist()]
            assert held, f"a rank holds no rollout ({trees} trees, cap {cap})"
            seen.extend(held)
        assert sorted(seen) == list(range(forest.num_rollouts))
        flat = planner.balance(forest.rollout_len, 8, cap, sync=sync)
        assert balanced.step.step_sync_cost <= flat.step.step_sync_cost


def test_an_empty_input_is_nothing_to_plan_for_plan_local_and_balance():
    empty = Forest(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    for call in (
        lambda: planner.plan_local(empty, 100),
        lambda: planner.plan_local(empty, 100, algorithm="ffd"),
        lambda: planner.balance(empty, 2, 100),
    ):
        with pytest.raises(ValueError, match="forest: no rollouts .*nothing to plan"):
            call()
    for call in (lambda: planner.plan_local([], 100), lambda: planner.balance([], 2, 100)):
        with pytest.raises(ValueError, match="seq_lens is empty: nothing to plan"):
            call()
    # A rank with nothing joins a round: local_bound and partition take both.
    assert planner.partition(empty, 2, 100).num_micro_batches == 2
    assert planner.partition([], 2, 100).num_micro_batches == 2
    assert planner.local_bound(empty, 100).k == planner.local_bound([], 100).k


def test_fewer_rollouts_than_ranks_name_the_filler():
    forest = forest_from_groups([100], [[10, 20, 30]])
    balanced = planner.balance(forest, 8, 1000)
    fillers = 0
    for rank in balanced.ranks:
        holds = any(len(mb.rollouts) for mb in rank.plan.micro_batches)
        for mb in rank.plan.micro_batches:
            assert mb.meta.filler == (not holds)
            assert mb.meta.empty or holds
        fillers += not holds
    assert fillers == 5
