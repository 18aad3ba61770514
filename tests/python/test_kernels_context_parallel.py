"""Context-parallel kernels (packsched.kernels.cp_*): head-tail sharding and its inverse, shard
positions and labels, shard attention against the full causal attention, sharded cross entropy
with loss weights, and the equal-work property of the layout. Expected values come from plain
torch indexing and float64 references, not from the kernels."""

import pytest
import torch

from packsched import kernels

CP_SIZES = [1, 2, 3, 4]


def aligned_offsets(lengths, cp):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + -(-n // (2 * cp)) * (2 * cp))
    return cu


def reference_rows(cu, cp, rank):
    """Rank's rows by definition: per sequence chunk rank, then chunk 2cp-1-rank."""
    rows = []
    for a, b in zip(cu, cu[1:]):
        m = (b - a) // (2 * cp)
        rows += list(range(a + rank * m, a + (rank + 1) * m))
        rows += list(range(a + (2 * cp - 1 - rank) * m, a + (2 * cp - rank) * m))
    return rows


@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.int32, torch.uint8])
def test_shard_is_head_and_tail_chunks_and_unshard_inverts_it(cp, dtype):
    cu = aligned_offsets([5, 0, 17, 1, 40], cp)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    x = (torch.arange(cu[-1] * 6).reshape(cu[-1], 2, 3) % 251).to(dtype)
    shards = [kernels.cp_shard(x, cu_t, cp, r) for r in range(cp)]
    for r, shard in enumerate(shards):
        assert torch.equal(shard, x[reference_rows(cu, cp, r)])
        layout = kernels.cp_layout(cu, cp, r)
        ranges = torch.cat([torch.arange(a, b) for a, b in layout["row_ranges"]])
        assert ranges.tolist() == reference_rows(cu, cp, r)
        assert layout["rows"] == shard.shape[0] == cu[-1] // cp
        assert layout["cu_seqlens_q"] == [v // cp for v in cu]
        # positions: the row's offset within its sequence
        starts = {row: a for a, b in zip(cu, cu[1:]) for row in range(a, b)}
        assert layout["positions"] == [row - starts[row] for row in reference_rows(cu, cp, r)]
        assert kernels.cp_position_ids(cu_t, cp, r).tolist() == layout["positions"]
    assert torch.equal(kernels.cp_unshard(shards, cu_t, cp), x)


def test_numpy_inputs_and_host_offsets():
    import numpy as np

    cu = [0, 8, 24]
    x = np.arange(24, dtype=np.int64)
    shards = [
        kernels.cp_shard(x, np.asarray(cu, np.int32), 2, r, cu_seqlens_host=cu) for r in (0, 1)
    ]
    assert shards[1].tolist() == reference_rows(cu, 2, 1)
    assert kernels.cp_unshard(shards, np.asarray(cu, np.int32), 2).tolist() == x.tolist()


def test_misaligned_lengths_and_bad_ranks_are_refused():
    cu = torch.tensor([0, 8, 14], dtype=torch.int32)
    with pytest.raises(ValueError, match="not a multiple of 2 \\* cp = 4"):
        kernels.cp_shard(torch.zeros(14), cu, 2, 0)
    ok = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="rank"):
        kernels.cp_shard(torch.zeros(8), ok, 2, 2)
    with pytest.raises(ValueError, match="total mismatch"):
        kernels.cp_shard(torch.zeros(9), ok, 2, 0)
    with pytest.raises(ValueError, match="expected cp = 2 shards"):
        kernels.cp_unshard([torch.zeros(4)], ok, 2)


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_every_rank_gets_the_same_causal_work_for_every_sequence(cp):
    """Causal work of a query row = keys it sees = its global position + 1."""
    g = torch.Generator().manual_seed(cp)
    lengths = torch.randint(1, 3000, (50,), generator=g).tolist()
    cu = aligned_offsets(lengths, cp)
    for a, b in zip(cu, cu[1:]):
        work = []
        for r in range(cp):
            layout = kernels.cp_layout([0, b - a], cp, r)
            work.append(sum(p + 1 for p in layout["positions"]))
        assert len(set(work)) == 1, work


def shift_reference(targets, cu_real, cu_pad, ignore):
    labels = torch.full((cu_pad[-1],), ignore, dtype=targets.dtype)
    for b in range(len(cu_real) - 1):
        n = cu_real[b + 1] - cu_real[b]
        labels[cu_pad[b] : cu_pad[b] + n - 1] = targets[cu_real[b] + 1 : cu_real[b + 1]]
    return labels


@pytest.mark.parametrize("cp", CP_SIZES)
def test_shard_labels_are_shifted_before_sharding(cp):
    lengths = [9, 3, 16, 1]
    cu_real = [0]
    for n in lengths:
        cu_real.append(cu_real[-1] + n)
    cu_pad = aligned_offsets(lengths, cp)
    ids = torch.arange(100, 100 + cu_real[-1])
    aligned, cu_pad_t, _ = kernels.pack_aligned(
        ids, torch.tensor(cu_real, dtype=torch.int32), 2 * cp, pad_value=-100
    )
    assert cu_pad_t.tolist() == cu_pad
    expected = shift_reference(ids, cu_real, cu_pad, -100)
    for r in range(cp):
        got = kernels.cp_shift_labels(
            aligned, torch.tensor(cu_real, dtype=torch.int32), cu_pad_t, cp, r
        )
        assert got.tolist() == expected[reference_rows(cu_pad, cp, r)].tolist()


def dense_causal(q, k, v, cu, scale):
    """float64 reference: per sequence, softmax(q k^T * scale) v with a causal mask; GQA."""
    out = torch.zeros_like(q)
    group = q.shape[1] // k.shape[1]
    for a, b in zip(cu, cu[1:]):
        if a == b:
            continue
        qs, ks, vs = q[a:b], k[a:b].repeat_interleave(group, 1), v[a:b].repeat_interleave(group, 1)
        s = torch.einsum("ihd,jhd->hij", qs, ks) * scale
        mask = torch.ones(b - a, b - a, dtype=torch.bool).tril()
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        out[a:b] = torch.einsum("hij,jhd->ihd", p, vs)
    return out


@pytest.mark.parametrize("cp", CP_SIZES)
def test_shard_attention_equals_the_shard_of_full_causal_attention(cp):
    g = torch.Generator().manual_seed(7 + cp)
    cu = aligned_offsets([13, 0, 40, 8], cp)
    total, heads, kv_heads, dim = cu[-1], 4, 2, 8
    q = torch.randn(total, heads, dim, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(total, kv_heads, dim, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(total, kv_heads, dim, generator=g, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(total, heads, dim, generator=g, dtype=torch.float64)
    full = dense_causal(q, k, v, cu, dim**-0.5)
    (full * dout).sum().backward()
    dq_ref, dk_ref, dv_ref = q.grad.clone(), k.grad.clone(), v.grad.clone()
    q.grad = k.grad = v.grad = None

    cu_t = torch.tensor(cu, dtype=torch.int32)
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for r in range(cp):
        rows = reference_rows(cu, cp, r)
        q_r = q.detach()[rows].clone().requires_grad_(True)
        k_r, v_r = k.detach().clone().requires_grad_(True), v.detach().clone().requires_grad_(True)
        out = kernels.cp_attention(q_r, k_r, v_r, cu_t, cp, r)
        assert torch.allclose(out, full.detach()[rows], atol=1e-12, rtol=0)
        (out * dout[rows]).sum().backward()
        dq[rows] = q_r.grad
        dk += k_r.grad  # the reduce-scatter of a trainer's all-gather backward, summed here
        dv += v_r.grad
    for got, ref in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert torch.allclose(got, ref, atol=1e-11, rtol=0)


@pytest.mark.parametrize("cp", CP_SIZES)
def test_sharded_cross_entropy_sums_to_the_weighted_full_loss(cp):
    g = torch.Generator().manual_seed(cp)
    cu = aligned_offsets([7, 12, 4], cp)
    total, vocab = cu[-1], 11
    logits = torch.randn(total, vocab, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, vocab, (total,), generator=g)
    labels[::3] = -100
    weights = [0.5, 2.0, 1.25]
    per_token = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    expected = sum(w * per_token[a:b].sum() for w, a, b in zip(weights, cu, cu[1:]))
    expected.backward()
    grad_ref = logits.grad.clone()
    logits.grad = None
    total_loss = 0.0
    for r in range(cp):
        rows = reference_rows(cu, cp, r)
        shard = logits.detach()[rows].clone().requires_grad_(True)
        loss, sums, counts = kernels.cp_cross_entropy(
            shard, labels[rows], cu, cp, loss_weights=weights
        )
        loss.backward()
        total_loss += float(loss)
        assert torch.allclose(grad_ref[rows], shard.grad, atol=1e-13, rtol=0)
        assert counts.sum() == (labels[rows] != -100).sum()
    assert abs(total_loss - float(expected)) < 1e-12


@pytest.mark.skipif(
    not torch.cuda.is_available() or not kernels.built_with_cuda(),
    reason="needs a CUDA device and a CUDA build",
)
def test_cuda_matches_cpu():
    cp = 4
    cu = aligned_offsets([5, 0, 17, 300], cp)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    x = torch.randn(cu[-1], 3, 64)
    shards = [kernels.cp_shard(x.cuda(), cu_t.cuda(), cp, r, cu_seqlens_host=cu) for r in range(cp)]
    for r, shard in enumerate(shards):
        assert torch.equal(shard.cpu(), kernels.cp_shard(x, cu_t, cp, r))
    assert torch.equal(kernels.cp_unshard(shards, cu_t.cuda(), cp, cu_seqlens_host=cu).cpu(), x)
    q = torch.randn(cu[-1] // cp, 4, 64, dtype=torch.float32)
    k_, v = torch.randn(cu[-1], 2, 64), torch.randn(cu[-1], 2, 64)
    out_cpu = kernels.cp_attention(q, k_, v, cu, cp, 1)
    out_gpu = kernels.cp_attention(q.cuda(), k_.cuda(), v.cuda(), cu, cp, 1)
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=1e-4, rtol=0)
    types = torch.tensor([0, 1, 1, 1, 1, 1, 1, 0, 0, 0], dtype=torch.int32)
    cu_m = torch.tensor([0, 8, 10], dtype=torch.int32)
    pos_cpu, _ = kernels.mrope_position_ids(types, cu_m, [[1, 4, 6]], [1, 0], total=12)
    pos_gpu, _ = kernels.mrope_position_ids(
        types.cuda(), cu_m.cuda(), [[1, 4, 6]], [1, 0], cu_seqlens_host=[0, 8, 10], total=12
    )
    assert torch.equal(pos_gpu.cpu(), pos_cpu)


@pytest.mark.parametrize("cp", CP_SIZES)
def test_segment_rows_partition_every_segment_over_the_group(cp):
    from packsched._cp_layout import segment_rows

    for length in (0, 2 * cp, 6 * cp, 40 * cp):
        rows = sorted(
            row for r in range(cp) for a, b in segment_rows(length, cp, r) for row in range(a, b)
        )
        assert rows == list(range(length))  # each row on exactly one member
    with pytest.raises(ValueError, match="not a multiple of 2 \\* cp"):
        segment_rows(2 * cp + 1, cp, 0)
