"""Tree-packing kernels from Python (packsched.tree_kernels): tree attention against each rollout
run on its own through varlen_attention (forward and backward, float64 and bf16, GQA, window,
softcap), depths, the multi-target cross entropy against torch, targets and restore."""

import pathlib
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packsched import kernels, tree_kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "helpers"))

import tree_layout  # noqa: E402


def forests():
    rng = np.random.default_rng(3)
    return [
        tree_layout.grpo_forest(rng, groups=2, n=8, prompt_len=(20, 90), completion_len=(1, 40)),
        tree_layout.multiturn_forest(rng, trees=2, depth=3, turn_len=(1, 30)),
    ]


def per_rollout_loss(q, k, v, layout, weights, **kw):
    """sum over rollouts of <out_r, weights[rows_r] / copies>: every rollout alone, causal."""
    copies = np.zeros(len(layout.ids), dtype=np.int64)
    for rows in layout.rows:
        copies[rows] += 1
    index = torch.as_tensor(np.concatenate(layout.rows))
    lens = [len(r) for r in layout.rows]
    cu = [0] + np.cumsum(lens).tolist()
    out = kernels.varlen_attention(
        q[index],
        k[index],
        v[index],
        torch.tensor(cu, dtype=torch.int32),
        torch.tensor(cu, dtype=torch.int32),
        max(lens),
        max(lens),
        causal=True,
        window_size=(kw.get("window_left", -1), -1),
        softcap=kw.get("softcap", 0.0),
    )
    w = weights[index] / torch.as_tensor(copies[index], dtype=weights.dtype)[:, None, None]
    return (out.double() * w.double()).sum(), out, index


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("options", [{}, {"window_left": 25, "softcap": 3.0}])
def test_tree_attention_equals_each_rollout_alone(dtype, options):
    for forest in forests():
        layout = tree_layout.pack(forest, forest.roots())
        rows, heads, kv_heads, dim = len(layout.ids), 4, 2, 16
        g = torch.Generator().manual_seed(0)
        q, k, v = (
            torch.randn(rows, h, dim, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
            for h in (heads, kv_heads, kv_heads)
        )
        weights = torch.randn(rows, heads, dim, generator=g, dtype=torch.float64)
        cu = torch.tensor(layout.cu, dtype=torch.int32)
        max_len = max(b - a for a, b in zip(layout.cu, layout.cu[1:]))
        out = kernels.tree_attention(
            q,
            k,
            v,
            cu,
            max_len,
            torch.tensor(layout.subtree_end, dtype=torch.int32),
            torch.tensor(layout.positions, dtype=torch.int32),
            cu_seqlens_host=layout.cu,
            **options,
        )
        (out.double() * weights).sum().backward()
        got = [x.grad.double().clone() for x in (q, k, v)]
        for x in (q, k, v):
            x.grad = None
        loss, alone, index = per_rollout_loss(q, k, v, layout, weights, **options)
        loss.backward()
        want = [x.grad.double() for x in (q, k, v)]
        tol = 1e-12 if dtype == torch.float64 else 3e-2
        assert (out[index].double() - alone.double()).abs().max() <= tol
        for name, a, b in zip("qkv", got, want):
            scale = max(1.0, float(b.abs().max()))
            assert float((a - b).abs().max()) <= tol * scale * (
                1 if dtype == torch.float64 else 4
            ), name


def test_a_sibling_that_sees_its_sibling_changes_the_output():
    forest = forests()[0]
    layout = tree_layout.pack(forest, forest.roots())
    rows = len(layout.ids)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(rows, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor(layout.cu, dtype=torch.int32)
    flat = np.repeat(np.diff(layout.cu), np.diff(layout.cu)) + np.repeat(
        layout.cu[:-1], np.diff(layout.cu)
    )
    tree = kernels.tree_attention(
        q, k, v, cu, rows, torch.tensor(layout.subtree_end, dtype=torch.int32)
    )
    causal = kernels.tree_attention(q, k, v, cu, rows, torch.tensor(flat, dtype=torch.int32))
    _, alone, index = per_rollout_loss(
        q, k, v, layout, torch.zeros(rows, 2, 8, dtype=torch.float64)
    )
    assert (tree[index] - alone).abs().max() < 1e-12
    assert (causal[index] - alone).abs().max() > 1e-3


def test_tree_attention_validation_and_numpy():
    forest = forests()[1]
    layout = tree_layout.pack(forest, forest.roots())
    rows = len(layout.ids)
    q = np.random.default_rng(0).standard_normal((rows, 2, 8))
    cu = np.asarray(layout.cu, dtype=np.int32)
    se = np.asarray(layout.subtree_end, dtype=np.int32)
    out = kernels.tree_attention(q, q, q, cu, rows, se)
    assert isinstance(out, np.ndarray) and out.shape == q.shape
    with pytest.raises(ValueError, match="positions is required"):
        kernels.tree_attention(q, q, q, cu, rows, se, window_left=3)
    bad = se.copy()
    bad[0] = 0
    with pytest.raises(ValueError, match=r"subtree_end\[0\] = 0"):
        kernels.tree_attention(q, q, q, cu, rows, bad)


def test_tree_position_ids_are_the_depths():
    for forest in forests():
        layout = tree_layout.pack(forest, forest.roots())
        got = kernels.tree_position_ids(
            torch.tensor(layout.cu, dtype=torch.int32),
            torch.tensor(layout.subtree_end + [0, 0], dtype=torch.int32),  # tail rows: not read
            total=len(layout.ids) + 2,
        )
        assert got.tolist() == layout.positions + [0, 1]
        for r, rows in zip(layout.rollouts, layout.rows):
            assert got[torch.as_tensor(rows)].tolist() == list(range(len(rows)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_multi_target_cross_entropy_against_torch(dtype):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(9, 13, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    rows = torch.tensor([0, 0, 1, 3, 3, 3, 7, 8], dtype=torch.int64)
    labels = torch.tensor([2, 5, 0, 1, 1, 12, 4, 4], dtype=torch.int64)
    weights = torch.randn(len(rows), generator=g, dtype=torch.float64)
    loss = kernels.multi_target_cross_entropy(logits, rows, labels)
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    (loss.double() * weights).sum().backward()
    got = logits.grad.double()
    ref_logits = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(ref_logits[rows], labels, reduction="none")
    (ref * weights).sum().backward()
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    assert (loss.double() - ref.detach()).abs().max() <= tol
    assert (got - ref_logits.grad).abs().max() <= tol * 4
    with pytest.raises(ValueError, match="rows"):
        kernels.multi_target_cross_entropy(logits.detach(), rows.flip(0), labels)


def test_targets_count_a_shared_token_once_per_rollout_and_restore():
    forest = forests()[1]
    layout = tree_layout.pack(forest, forest.roots())
    rollouts = [forest.rollout(r) for r in layout.rollouts]
    w = np.random.default_rng(5).random(len(rollouts)) + 0.5
    targets = tree_kernels.tree_targets(
        layout.rows, [ids for ids, _ in rollouts], list(w), loss_masks=[m for _, m in rollouts]
    )
    assert np.all(np.diff(targets.rows) >= 0)
    # A branching row carries one target per distinct next token.
    assert len(targets.rows) > len(np.unique(targets.rows))
    logits = torch.randn(
        len(layout.ids), 61, generator=torch.Generator().manual_seed(4), dtype=torch.float64
    )
    loss = kernels.multi_target_cross_entropy(
        logits, torch.as_tensor(targets.rows), torch.as_tensor(targets.labels)
    )
    packed = float((loss * torch.as_tensor(targets.weights)).sum())
    direct, logprobs = 0.0, []
    for (ids, mask), rows, wr in zip(rollouts, layout.rows, w):
        lp = torch.log_softmax(logits[torch.as_tensor(rows[:-1])], dim=-1)
        lp = lp.gather(1, torch.as_tensor(ids[1:])[:, None])[:, 0]
        direct += float(-(lp * torch.as_tensor(mask[1:], dtype=torch.float64)).sum()) * wr
        logprobs.append(lp)
    assert packed == pytest.approx(direct, rel=1e-12)
    for got, want in zip(tree_kernels.restore(-loss, targets.index), logprobs):
        assert torch.allclose(got, want, rtol=0, atol=1e-12)
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    for got, rows in zip(tree_kernels.restore(entropy, layout.rows), layout.rows):
        assert torch.equal(got, entropy[torch.as_tensor(rows)])


def test_tree_mrope_positions_are_each_rollouts_own():
    # A prompt with an image (grid 1 x 4 x 4, merge 2: 4 vision tokens) shared by 3 completions.
    prompt_types = [0, 0, 1, 1, 1, 1, 0]
    completions = [3, 1, 4]
    rows, start, types = [], len(prompt_types), []
    for n in completions:
        rows.append(list(range(len(prompt_types))) + list(range(start, start + n)))
        types.append(prompt_types + [0] * n)
        start += n
    grids = [[1, 4, 4]] * len(completions)
    got = tree_kernels.tree_mrope_position_ids(rows, types, grids, [1, 1, 1], start)
    for r, t in zip(rows, types):
        alone, _ = kernels.mrope_position_ids(
            np.asarray(t, dtype=np.int32), np.asarray([0, len(t)], dtype=np.int32), [[1, 4, 4]], [1]
        )
        assert np.array_equal(got[:, r], np.asarray(alone))
    types[1] = [0] * len(types[1])  # the second rollout's prompt without the image
    with pytest.raises(ValueError, match="disagree"):
        tree_kernels.tree_mrope_position_ids(rows, types, grids[:2], [1, 0, 1], start)


def test_tree_targets_by_hand():
    # Two rollouts share tokens 5, 6 (rows 0, 1) and branch: 7 at row 2, 8 at row 3.
    t = tree_kernels.tree_targets([[0, 1, 2], [0, 1, 3]], [[5, 6, 7], [5, 6, 8]], [1.0, [0.5, 2.0]])
    assert t.rows.tolist() == [0, 1, 1] and t.labels.tolist() == [6, 7, 8]
    assert t.weights.tolist() == [1.5, 1.0, 2.0]  # row 0 once per rollout; row 1 per next token
    assert [i.tolist() for i in t.index] == [[0, 1], [0, 2]]
    masked = tree_kernels.tree_targets(
        [[0, 1, 2]], [[5, 6, 7]], [2.0], loss_masks=[[False, False, True]]
    )
    assert masked.weights.tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="one entry per rollout"):
        tree_kernels.tree_targets([[0, 1]], [[5, 6]], [])
    with pytest.raises(ValueError, match="same"):
        tree_kernels.tree_targets([[0, 1]], [[5, 6, 7]], [1.0])


def test_tree_attention_with_pad_slots():
    forest = forests()[0]
    layout = tree_layout.pack(forest, forest.roots())
    lens = np.diff(layout.cu)
    pads = np.array([3, 8])
    cu_a = np.concatenate([[0], np.cumsum(lens + pads)]).astype(np.int32)
    where = np.concatenate([np.arange(a, a + n) for a, n in zip(cu_a[:-1], lens)])
    shift = np.repeat(cu_a[:-1] - np.asarray(layout.cu[:-1]), lens)
    se = np.zeros(cu_a[-1], dtype=np.int32)
    se[where] = np.asarray(layout.subtree_end) + shift
    g = torch.Generator().manual_seed(6)
    q = torch.randn(len(layout.ids), 2, 8, generator=g, dtype=torch.float64)
    qa = torch.full((cu_a[-1], 2, 8), float("nan"), dtype=torch.float64)
    qa[torch.as_tensor(where)] = q
    cu = torch.tensor(layout.cu, dtype=torch.int32)
    se_packed = torch.tensor(layout.subtree_end, dtype=torch.int32)
    want = kernels.tree_attention(q, q, q, cu, int(lens.max()), se_packed)
    got = kernels.tree_attention(
        qa,
        qa,
        qa,
        torch.as_tensor(cu_a),
        int((lens + pads).max()),
        torch.as_tensor(se),
        seqused=torch.as_tensor(lens.astype(np.int32)),
    )
    assert torch.equal(got[torch.as_tensor(where)], want)
    pad_rows = torch.ones(cu_a[-1], dtype=torch.bool)
    pad_rows[torch.as_tensor(where)] = False
    assert torch.all(got[pad_rows] == 0)
