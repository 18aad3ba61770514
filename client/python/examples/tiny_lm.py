"""A tiny causal language model run two ways: packed with packsched (plan, kernels, loss weights)
and padded in plain torch (the reference). Shared by train_tiny_lm.py and the end-to-end
gradient test (tests/python/test_gradient_equivalence.py).

Conventions: a sequence is int64 token ids [L] with a loss mask [L] (False on prompt tokens);
token t is trained to predict token t+1 when t+1 < L and mask[t+1] (so a sequence has
mask[1:].sum() "loss tokens"). The objective of each loss mode is docs/design.md §2's.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from packsched import kernels

IGNORE = -100


class TinyCausalLM(torch.nn.Module):
    """Embedding + learned positions, one pre-norm block (GQA attention, MLP), output head.
    Parameters are initialised from ``seed`` alone, so every process builds the same model."""

    def __init__(
        self,
        vocab=61,
        dim=32,
        heads=4,
        kv_heads=2,
        head_dim=8,
        max_len=512,
        seed=0,
        dtype=torch.float64,
    ):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(max_len, dim)
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * head_dim)
        self.out = torch.nn.Linear(heads * head_dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
        )
        self.head = torch.nn.Linear(dim, vocab)
        torch.random.set_rng_state(generator_state)
        self.to(dtype)

    def _qkv(self, x):
        q, k, v = self.qkv(x).split(
            [
                self.heads * self.head_dim,
                self.kv_heads * self.head_dim,
                self.kv_heads * self.head_dim,
            ],
            dim=-1,
        )
        shape = x.shape[:-1]
        return (
            q.reshape(*shape, self.heads, self.head_dim),
            k.reshape(*shape, self.kv_heads, self.head_dim),
            v.reshape(*shape, self.kv_heads, self.head_dim),
        )

    def forward_packed(
        self, ids, positions, cu_seqlens, cu_seqlens_host, max_seqlen, seqused=None, total=None
    ):
        """ids, positions: [T]; cu_seqlens: int32 [B+1] (host copy in cu_seqlens_host) ->
        logits [T, vocab]. Attention runs through packsched.kernels.varlen_attention. For an
        aligned layout: cu_seqlens are its padded offsets, seqused the real lengths, and total
        the rows T when they end with a tail (align_total_to)."""
        x = self.embed(ids) + self.pos(positions)
        q, k, v = self._qkv(self.norm1(x))
        a = kernels.varlen_attention(
            q,
            k,
            v,
            cu_seqlens,
            cu_seqlens,
            max_seqlen,
            max_seqlen,
            causal=True,
            seqused_q=seqused,
            seqused_k=seqused,
            cu_seqlens_q_host=cu_seqlens_host,
            cu_seqlens_k_host=cu_seqlens_host,
            total_q=total,
            total_k=total,
        )
        x = x + self.out(a.reshape(len(ids), -1))
        return self.head(x + self.mlp(self.norm2(x)))

    def forward_cp(self, ids, positions, cu_seqlens_host, cp, rank, gather):
        """One context-parallel rank's forward: ids, positions [T / cp] are its shard of an
        aligned micro-batch with offsets ``cu_seqlens_host`` (lengths multiples of 2 * cp);
        ``gather(shard)`` returns the whole micro-batch of a key/value shard in global order (an
        all-gather over the CP group then cp_unshard, whose backward reduce-scatters). Returns the
        shard's logits [T / cp, vocab]; attention through packsched.kernels.cp_attention."""
        x = self.embed(ids) + self.pos(positions)
        q, k, v = self._qkv(self.norm1(x))
        a = kernels.cp_attention(q, gather(k), gather(v), cu_seqlens_host, cp, rank)
        x = x + self.out(a.reshape(len(ids), -1))
        return self.head(x + self.mlp(self.norm2(x)))

    def forward_padded(self, ids, mask):
        """ids, mask: [B, S] (right padding, mask True on real tokens) -> logits [B, S, vocab],
        with plain torch attention (causal, pads never keys)."""
        batch, seqlen = ids.shape
        positions = torch.arange(seqlen).expand(batch, seqlen)
        x = self.embed(ids) + self.pos(positions)
        q, k, v = self._qkv(self.norm1(x))
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(self.head_dim)
        causal = torch.ones(seqlen, seqlen, dtype=torch.bool).tril()
        allowed = causal[None, None] & mask[:, None, None, :]
        p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        a = torch.einsum("bhst,bthd->bshd", p, v)
        x = x + self.out(a.reshape(batch, seqlen, -1))
        return self.head(x + self.mlp(self.norm2(x)))


def make_batch(num_sequences, seed, vocab=61, max_len=96):
    """(ids, loss masks): random lengths in [2, max_len]; a random-length prompt masked out, except
    every second sequence, trained from its first token (pretraining/SFT without a prompt: the
    token a cross-boundary label would wrongly target), and every fifth, masked entirely (it has no
    loss tokens)."""
    g = torch.Generator().manual_seed(seed)
    ids, masks = [], []
    for i in range(num_sequences):
        length = int(torch.randint(2, max_len + 1, (1,), generator=g))
        ids.append(torch.randint(0, vocab, (length,), generator=g))
        prompt = int(torch.randint(1, length, (1,), generator=g))
        if i % 2 == 0:
            prompt = 0
        if i % 5 == 4:
            prompt = length
        mask = torch.ones(length, dtype=torch.bool)
        mask[:prompt] = False
        masks.append(mask)
    return ids, masks


def loss_tokens(masks):
    """Per sequence: the tokens with a label (mask[1:])."""
    return [int(m[1:].sum()) for m in masks]


def direct_objective(per_sequence_sums, counts, mode, sum_norm_constant=1.0):
    """The loss of one whole batch from each sequence's summed token loss and its loss-token
    count, by definition."""
    with_loss = [i for i, c in enumerate(counts) if c > 0]
    if mode == "token_mean":
        return sum(per_sequence_sums) / sum(counts)
    if mode == "sample_mean":
        return sum(per_sequence_sums[i] / counts[i] for i in with_loss) / len(with_loss)
    if mode == "seq_sum":
        return sum(per_sequence_sums[i] for i in with_loss) / len(with_loss)
    if mode == "sum":
        return sum(per_sequence_sums)
    if mode == "sum_norm":
        return sum(per_sequence_sums) / sum_norm_constant
    raise ValueError(f"unknown loss mode {mode!r}")


def padded_loss(model, ids, masks, mode, sum_norm_constant=1.0):
    """The reference: the whole batch padded to [B, longest], one forward, the objective."""
    batch, seqlen = len(ids), max(len(x) for x in ids)
    tokens = torch.zeros(batch, seqlen, dtype=torch.int64)
    real = torch.zeros(batch, seqlen, dtype=torch.bool)
    trained = torch.zeros(batch, seqlen, dtype=torch.bool)
    for b, (x, m) in enumerate(zip(ids, masks)):
        tokens[b, : len(x)], real[b, : len(x)], trained[b, : len(x)] = x, True, m
    logits = model.forward_padded(tokens, real)
    labels = torch.where(
        real[:, 1:] & trained[:, 1:], tokens[:, 1:], torch.full_like(tokens[:, 1:], IGNORE)
    )
    per_token = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    ).view(batch, seqlen - 1)
    sums = list(per_token.sum(dim=1))
    counts = [int(c) for c in (labels != IGNORE).sum(dim=1)]
    return direct_objective(sums, counts, mode, sum_norm_constant)


def packed_backward(
    model, plan, ids, masks, cross_boundary_labels=False, align_to=None, pad_id=0, align_total_to=1
):
    """Runs every micro-batch of ``plan`` packed and accumulates the weighted gradient
    (sum over sequences of plan.loss_weights[s] times its summed token loss). Empty micro-batches
    run a one-token dummy pass with weight 0, as trainers that need every rank to run k passes do.
    ``cross_boundary_labels`` shifts labels over the whole packed buffer (the classic packing
    bug: a sequence's last token learns the next sequence's first) — for the negative control.
    ``align_to`` (the plan's): run the aligned layout instead, exactly the plan's ``total`` rows
    per micro-batch (pack_aligned with ``total``: pad slots and the align_total_to tail hold
    ``pad_id``); an empty micro-batch then runs an all-tail dummy of ``align_total_to`` rows (the
    plan's; no sequence, so its loss and gradient are 0 without a weight, and a Ulysses group can
    split it like any other micro-batch). Returns the number of real tokens run."""
    if align_to is not None:
        return _packed_backward_aligned(model, plan, ids, masks, align_to, pad_id, align_total_to)
    tokens = 0
    for indices, meta in zip(plan.micro_batches, plan.metadata):
        if meta.empty:
            dummy = model.forward_packed(
                torch.zeros(1, dtype=torch.int64),
                torch.zeros(1, dtype=torch.int64),
                torch.tensor([0, 1], dtype=torch.int32),
                [0, 1],
                1,
            )
            (dummy.sum() * 0.0).backward()
            continue
        packed_ids = torch.cat([ids[i] for i in indices])
        packed_mask = torch.cat([masks[i] for i in indices])
        cu = torch.tensor(meta.cu_seqlens, dtype=torch.int32)
        positions = kernels.position_ids(cu, cu_seqlens_host=meta.cu_seqlens)
        targets = torch.where(packed_mask, packed_ids, torch.full_like(packed_ids, IGNORE))
        if cross_boundary_labels:
            labels = torch.cat([targets[1:], torch.tensor([IGNORE])])
        else:
            labels = kernels.shift_labels(targets, cu, cu_seqlens_host=meta.cu_seqlens)
        logits = model.forward_packed(packed_ids, positions, cu, meta.cu_seqlens, meta.max_seqlen)
        _, sums, _ = kernels.packed_cross_entropy(
            logits, labels, cu, cu_seqlens_host=meta.cu_seqlens
        )
        weights = torch.tensor([plan.loss_weights[i] for i in indices], dtype=sums.dtype)
        (sums * weights).sum().backward()
        tokens += meta.tokens
    return tokens


def _all_tail_dummy_backward(model, rows, pad_id):
    """A dummy pass over ``rows`` tail rows and no sequence (B = 0): every kernel defines the
    tail, and its loss and gradient are 0 by the kernels' contract, so no weight is applied."""
    cu = torch.zeros(1, dtype=torch.int32)
    ids = torch.full((rows,), pad_id, dtype=torch.int64)
    positions = kernels.position_ids(cu, total=rows, cu_seqlens_host=[0])
    logits = model.forward_packed(ids, positions, cu, [0], 0, total=rows)
    labels = kernels.shift_labels(ids, cu, cu_seqlens_host=[0], total=rows)
    loss, _, _ = kernels.packed_cross_entropy(logits, labels, cu, cu_seqlens_host=[0], total=rows)
    loss.sum().backward()


def _packed_backward_aligned(model, plan, ids, masks, align_to, pad_id, align_total_to):
    tokens = 0
    for indices, meta in zip(plan.micro_batches, plan.metadata):
        if meta.empty:
            _all_tail_dummy_backward(model, max(1, align_total_to), pad_id)
            continue
        cu = torch.tensor(meta.cu_seqlens, dtype=torch.int32)
        packed_ids = torch.cat([ids[i] for i in indices])
        targets = torch.where(
            torch.cat([masks[i] for i in indices]), packed_ids, torch.full_like(packed_ids, IGNORE)
        )
        host = meta.cu_seqlens
        ids_a, cu_a, seqused = kernels.pack_aligned(
            packed_ids, cu, align_to, pad_value=pad_id, cu_seqlens_host=host, total=meta.total
        )
        targets_a, _, _ = kernels.pack_aligned(
            targets, cu, align_to, pad_value=IGNORE, cu_seqlens_host=host, total=meta.total
        )
        host_a = meta.cu_seqlens_aligned
        positions = kernels.position_ids(cu_a, total=meta.total, cu_seqlens_host=host_a)
        labels = kernels.shift_labels(
            targets_a,
            cu,
            cu_seqlens_padded=cu_a,
            cu_seqlens_host=host,
            cu_seqlens_padded_host=host_a,
            total=meta.total,
        )
        logits = model.forward_packed(
            ids_a,
            positions,
            cu_a,
            host_a,
            meta.max_seqlen_aligned,
            seqused=seqused,
            total=meta.total,
        )
        _, sums, _ = kernels.packed_cross_entropy(
            logits, labels, cu_a, cu_seqlens_host=host_a, total=meta.total
        )
        weights = torch.tensor([plan.loss_weights[i] for i in indices], dtype=sums.dtype)
        (sums * weights).sum().backward()
        tokens += meta.tokens
    return tokens


class _GatherShards(torch.autograd.Function):
    """Forward: all-gather the CP group's shards and cp_unshard them (the whole micro-batch in
    global order). Backward: the group's gradients of the whole micro-batch summed, then
    cp_shard to this rank (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, shard, host, cp, rank, group):
        parts = [torch.empty_like(shard) for _ in range(cp)]
        dist.all_gather(parts, shard.contiguous(), group=group)
        ctx.args = (host, cp, rank, group)
        cu = torch.tensor(host, dtype=torch.int32)
        return kernels.cp_unshard(parts, cu, cp, cu_seqlens_host=host)

    @staticmethod
    def backward(ctx, grad):
        host, cp, rank, group = ctx.args
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=group)
        cu = torch.tensor(host, dtype=torch.int32)
        return kernels.cp_shard(grad, cu, cp, rank, cu_seqlens_host=host), None, None, None, None


def cp_packed_backward(model, plan, ids, masks, cp, rank, group):
    """packed_backward for CP rank ``rank`` of a context-parallel group (``group``, a
    torch.distributed process group of ``cp`` ranks that all hold the same plan and sequences):
    each micro-batch is packed aligned to 2 * cp (the plan's cu_seqlens_aligned, a plan made with
    context_parallel = cp), and this rank runs its head-tail shard of the ids, positions and
    shifted labels (shifted before sharding), attention of its queries against the group's
    all-gathered keys and values, and the weighted cross entropy of its rows. Summed over the CP
    group (an all-reduce of the gradients), the gradient is packed_backward's. Empty
    micro-batches are skipped by the whole group alike. Returns the real tokens of the plan."""
    tokens = 0
    for indices, meta in zip(plan.micro_batches, plan.metadata):
        if meta.empty:
            continue
        host, host_a = meta.cu_seqlens, meta.cu_seqlens_aligned
        cu, cu_a = (torch.tensor(h, dtype=torch.int32) for h in (host, host_a))
        packed = torch.cat([ids[i] for i in indices])
        targets = torch.where(
            torch.cat([masks[i] for i in indices]), packed, torch.full_like(packed, IGNORE)
        )
        ids_a, _, _ = kernels.pack_aligned(packed, cu, 2 * cp, cu_seqlens_host=host)
        targets_a, _, _ = kernels.pack_aligned(
            targets, cu, 2 * cp, pad_value=IGNORE, cu_seqlens_host=host
        )
        logits = model.forward_cp(
            kernels.cp_shard(ids_a, cu_a, cp, rank, cu_seqlens_host=host_a),
            kernels.cp_position_ids(cu_a, cp, rank, cu_seqlens_host=host_a),
            host_a,
            cp,
            rank,
            lambda shard: _GatherShards.apply(shard, host_a, cp, rank, group),
        )
        labels = kernels.cp_shift_labels(
            targets_a, cu, cu_a, cp, rank, cu_seqlens_host=host, cu_seqlens_padded_host=host_a
        )
        weights = [plan.loss_weights[i] for i in indices]
        loss, _, _ = kernels.cp_cross_entropy(logits, labels, host_a, cp, loss_weights=weights)
        loss.backward()
        tokens += meta.tokens
    return tokens


def flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])
