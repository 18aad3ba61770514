"""The query-row map of tree attention (AttentionSeqlens::query_rows): a CP rank's
tree_cp_attention computes only the rows it holds, and gives bitwise what computing every row
gives (output and the gradients of q, k and v), on planned GRPO and multi-turn forests for
cp = 2 and 4, float64 and bfloat16, with a left window on depths, a softcap and GQA. The raw call
writes the rows outside the map as queries that see no key; a bad map is refused naming it; the
own-row path never runs the every-row tree_attention, on CUDA tensors too (given a device).
"""

import pathlib
import sys

import numpy as np
import pytest
import torch

from packsched import _arrays, kernels, tree_kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from test_tree_cp import _tensors, planned_layouts  # noqa: E402


def _run(layout, cp, rank, dtype, all_rows, seed, **kw):
    cu, subtree_end, max_seqlen = _tensors(layout)
    rows = layout.cu[-1]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(rows, h, 8, generator=gen).to(dtype) for h in (4, 2, 2))
    d_out = torch.randn(rows, 4, 8, generator=gen).to(dtype)
    m = tree_kernels.tree_cp_rows(layout.cu, layout.positions, cp, rank)
    q_shard = tree_kernels.tree_cp_shard(q, m).requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    kw = dict(kw, all_rows=all_rows, cu_seqlens_host=layout.cu)
    out = tree_kernels.tree_cp_attention(q_shard, k, v, m, cu, max_seqlen, subtree_end, **kw)
    d_shard = tree_kernels.tree_cp_shard(d_out, m)
    grads = torch.autograd.grad((out * d_shard).sum(), (q_shard, k, v))
    return (out.detach(),) + grads


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("shape", ["grpo", "multiturn"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_own_rows_are_bitwise_all_rows(cp, shape, dtype):
    _, layouts = planned_layouts(cp, 40 + cp, shape)
    options = [{}, dict(positions=None, window_left=5, softcap=3.0)]  # positions: per layout
    checked = 0
    for n, layout in enumerate(layouts):
        for opt in options:
            kw = dict(opt)
            if "positions" in kw:
                kw["positions"] = torch.tensor(layout.positions, dtype=torch.int32)
            for rank in range(cp):
                own = _run(layout, cp, rank, dtype, False, n * 7 + rank, **kw)
                every = _run(layout, cp, rank, dtype, True, n * 7 + rank, **kw)
                for name, got, want in zip(("out", "dq", "dk", "dv"), own, every):
                    assert torch.equal(got, want), f"{name} differs (layout {n}, rank {rank})"
                checked += 1
    assert checked >= 2 * cp


def test_own_rows_take_the_map_path(monkeypatch):
    # The every-row path goes through tree_kernels.tree_attention; the own-row path must not.
    _, layouts = planned_layouts(2, 3, "grpo")

    def every_row(*args, **kwargs):
        raise AssertionError("tree_attention over every row")

    monkeypatch.setattr(tree_kernels, "tree_attention", every_row)
    _run(layouts[0], 2, 0, torch.float64, False, 1, softcap=2.0)
    with pytest.raises(AssertionError, match="every row"):
        _run(layouts[0], 2, 0, torch.float64, True, 1)


@pytest.mark.skipif(
    not torch.cuda.is_available() or not kernels.built_with_cuda(),
    reason="needs a CUDA device and CUDA kernels",
)
@pytest.mark.parametrize("dtype, head_dim", [(torch.bfloat16, 64), (torch.float32, 8)])
def test_cuda_own_rows_take_the_map_path_bitwise(monkeypatch, dtype, head_dim):
    # On CUDA too the own-row path carries the map (bf16 at head dim 64: the tensor-core kernels;
    # float32: the scalar ones) and gives bitwise what every row gives.
    _, layouts = planned_layouts(2, 7, "grpo")
    layout = layouts[0]
    cu, subtree_end, max_seqlen = (x.cuda() for x in _tensors(layout))
    rows = layout.cu[-1]
    gen = torch.Generator().manual_seed(3)
    q, k, v, d_out = (
        torch.randn(rows, h, head_dim, generator=gen).to(dtype).cuda() for h in (4, 2, 2, 4)
    )
    for rank in range(2):
        m = tree_kernels.tree_cp_rows(layout.cu, layout.positions, 2, rank)
        results = []
        for all_rows in (False, True):
            q_shard = tree_kernels.tree_cp_shard(q, m).requires_grad_()
            kv = [x.detach().clone().requires_grad_() for x in (k, v)]
            out = tree_kernels.tree_cp_attention(
                q_shard,
                *kv,
                m,
                cu,
                max_seqlen,
                subtree_end,
                all_rows=all_rows,
                cu_seqlens_host=layout.cu,
            )
            d_shard = tree_kernels.tree_cp_shard(d_out, m)
            results.append(
                (out.detach(),) + torch.autograd.grad((out * d_shard).sum(), [q_shard, *kv])
            )
        for name, got, want in zip(("out", "dq", "dk", "dv"), *results):
            assert torch.equal(got, want), f"{name} differs (rank {rank})"

    def every_row(*args, **kwargs):
        raise AssertionError("tree_attention over every row")

    monkeypatch.setattr(tree_kernels, "tree_attention", every_row)
    m = tree_kernels.tree_cp_rows(layout.cu, layout.positions, 2, 0)
    tree_kernels.tree_cp_attention(
        tree_kernels.tree_cp_shard(q, m),
        k,
        v,
        m,
        cu,
        max_seqlen,
        subtree_end,
        cu_seqlens_host=layout.cu,
    )


def _params(cu, max_seqlen, subtree_end, host):
    """The tree attention op's arguments by name (packsched._ops_attention.tree_attention)."""
    return dict(
        cu_seqlens=cu,
        max_seqlen=max_seqlen,
        subtree_end=subtree_end,
        positions=None,
        softmax_scale=None,
        window_left=-1,
        softcap=0.0,
        seqused=None,
        cu_seqlens_host=host,
        total=None,
    )


def test_rows_outside_the_map_see_no_key():
    _, layouts = planned_layouts(2, 5, "grpo")
    layout = layouts[0]
    cu, subtree_end, max_seqlen = _tensors(layout)
    rows = layout.cu[-1]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    m = tree_kernels.tree_cp_rows(layout.cu, layout.positions, 2, 1)
    params = _params(cu, max_seqlen, subtree_end, layout.cu)
    full_out, full_lse = _arrays._torch_ops().tree_attention(q, k, v, params)
    params["query_rows"] = torch.as_tensor(m.astype(np.int32))
    out, lse = _arrays._torch_ops().tree_attention(q, k, v, params)
    other = np.setdiff1d(np.arange(rows), m)
    assert len(other) == rows - len(m) > 0
    assert torch.equal(out[m], full_out[m]) and torch.equal(lse[:, m], full_lse[:, m])
    assert not out[other].any() and torch.isinf(lse[:, other]).all()
    assert full_out[other].abs().sum() > 0  # the unmapped rows do see keys without the map


@pytest.mark.parametrize(
    "query_rows, message",
    [([3, 1], r"query_rows\[1\] = 1 is outside \[4, "), ([0, 10_000], r"query_rows\[1\] = 10000")],
)
def test_bad_map_names_query_rows(query_rows, message):
    cu = torch.tensor([0, 16], dtype=torch.int32)
    subtree_end = torch.full((16,), 16, dtype=torch.int32)
    q = torch.randn(16, 2, 8)
    params = _params(cu, 16, subtree_end, None)
    params["query_rows"] = torch.tensor(query_rows, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        _arrays._torch_ops().tree_attention(q, q, q, params)
