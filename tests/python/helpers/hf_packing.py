"""Tiny Hugging Face decoders run packed, tree-packed and one sequence at a time, for the proofs
of packsched.integrations.transformers (tests/python/test_hf_transformers.py).

Every model comes from a small config with random weights (nothing downloaded). A batch is a
list of sequences (int64 token ids) with per-sequence loss weights (the plan's) and loss masks;
the objective is sum over sequences r and positions p of w_r * mask_r[p + 1] * CE(logits_r[p],
x_r[p + 1]), the loss rule of docs/design.md "Tree packing". Each runner returns the per-token
log-probabilities of every sequence (position p predicting token p + 1) and leaves the
objective's gradient in the parameters.
"""

import types

import numpy as np
import torch

from packsched import kernels, planner, tree, tree_kernels
from packsched.integrations import transformers as packsched_hf

VOCAB = 61
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    attention_dropout=0.0,
    initializer_range=0.2,
    use_cache=False,
    tie_word_embeddings=False,
)


def tiny_config(kind):
    """A small config of a decoder family: "qwen3", "llama", "qwen3_moe" or "gemma2" (sliding
    window of 4 tokens on its first layer, attention logits softcapped at 1.0)."""
    import transformers

    if kind == "qwen3":
        return transformers.Qwen3Config(**_COMMON)
    if kind == "llama":
        return transformers.LlamaConfig(**_COMMON)
    if kind == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            **_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
        )
    if kind == "gemma2":
        return transformers.Gemma2Config(
            **_COMMON,
            sliding_window=4,
            query_pre_attn_scalar=16,
            attn_logit_softcapping=1.0,
            final_logit_softcapping=30.0,
        )
    raise ValueError(kind)


def _rms_norm_in_input_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def norms_in_model_dtype(model):
    """Makes the Llama-style RMSNorms compute in the model's dtype, as they do in float32 and
    bfloat16 models: transformers' RMSNorm casts to float32 even in a float64 model, so its
    backward rounds a tree-packed shared row's gradient after the branches' gradients are summed
    and the reference's before, a float32 difference (~1e-7 of the gradient) that has nothing to
    do with attention. Gemma2's norm (1 + weight) is left as it is."""
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_rms_norm_in_input_dtype, module)
    return model


def tiny_model(kind, dtype, attn_implementation, seed=0):
    """The decoder with weights from ``seed`` alone, in ``dtype``, train mode; in float64 its
    norms compute in float64 (norms_in_model_dtype)."""
    import transformers

    packsched_hf.register()
    torch.manual_seed(seed)
    # The experts as a loop of matmuls: torch's grouped_mm has no float64.
    experts = {"experts_implementation": "eager"} if kind == "qwen3_moe" else {}
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config(kind), attn_implementation=attn_implementation, **experts
    )
    model = model.to(dtype).train()
    return norms_in_model_dtype(model) if dtype == torch.float64 else model


def random_sequences(rng, count, length=(2, 24)):
    return [
        torch.as_tensor(rng.integers(0, VOCAB, int(rng.integers(*length)))) for _ in range(count)
    ]


def gradients(model):
    """Every parameter's gradient by name (zeros where none flowed), then cleared."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
        p.grad = None
    return out


def _token_logprobs(logits, ids):
    """log p(ids[p + 1] | ids[:p + 1]) for p < L - 1, from one sequence's logits [L, V]."""
    return torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[1:, None]).squeeze(1)


def _objective(logprobs, weight, mask):
    return -(weight * mask[1:].to(logprobs.dtype) * logprobs).sum()


def per_sequence(model, sequences, weights, masks, implementation="sdpa"):
    """The reference: each sequence alone ([1, L], default position ids) with a stock
    attention of transformers. Returns the log-probabilities per sequence."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        out = []
        for ids, w, m in zip(sequences, weights, masks):
            logits = model(input_ids=ids[None]).logits[0]
            logprobs = _token_logprobs(logits, ids)
            _objective(logprobs, w, m).backward()
            out.append(logprobs.detach())
        return out
    finally:
        model.set_attn_implementation(previous)


def plan_rows(lengths, cap, masks):
    """packsched's plan of the sequences under ``cap`` tokens, token_mean loss weights."""
    return planner.plan_local(
        lengths,
        cap,
        loss_tokens=[int(m[1:].sum()) for m in masks],
        loss_mode="token_mean",
        progress=False,
    )


def packed(
    model,
    sequences,
    plan,
    masks,
    layout="position_ids",
    offsets="host lists",
    break_boundaries=False,
):
    """Every micro-batch of ``plan`` as one packed row ([1, total]) through the model's
    "packsched_varlen" attention. ``layout``: "position_ids" (the sequences come from the
    position ids restarting at 0, made by packsched.kernels.position_ids) or "cu_seq_lens"
    (transformers' FlashAttention kwargs from the plan, the offsets as ``offsets``: "host lists"
    or "int32 tensors"). ``break_boundaries``: a broken contract for the negative control
    (position ids counting on across the row, no offsets: the sequences see each other).
    Returns the log-probabilities per sequence."""
    out = [None] * len(sequences)
    for meta in plan.metadata:
        if meta.empty:
            continue
        ids = torch.cat([sequences[i] for i in meta.indices])
        cu = torch.as_tensor(meta.cu_seqlens, dtype=torch.int32)
        kwargs = {}
        if break_boundaries:
            kwargs["position_ids"] = torch.arange(len(ids))[None]
        elif layout == "position_ids":
            kwargs["position_ids"] = kernels.position_ids(cu)[None]
        else:
            kwargs["position_ids"] = kernels.position_ids(cu)[None]
            given = list(meta.cu_seqlens) if offsets == "host lists" else cu
            kwargs.update(
                cu_seq_lens_q=given,
                cu_seq_lens_k=given,
                max_length_q=meta.max_seqlen,
                max_length_k=meta.max_seqlen,
            )
        logits = model(input_ids=ids[None], **kwargs).logits[0]
        total = 0
        for j, i in enumerate(meta.indices):
            a, b = meta.cu_seqlens[j], meta.cu_seqlens[j + 1]
            logprobs = _token_logprobs(logits[a:b], ids[a:b])
            total = total + _objective(logprobs, plan.loss_weights[i], masks[i])
            out[i] = logprobs.detach()
        total.backward()
    return out


def forest_rollouts(shape, seed):
    """Rollouts that share prefixes, as token ids with loss masks, and their forest made by
    packsched.tree.build_forest from the token ids alone. ``shape``: "grpo" (2 prompts with
    n = 8 completions each) or "multiturn" (2 branching trees of 3 turns below the prompt)."""
    import tree_layout

    rng = np.random.default_rng(seed)
    if shape == "grpo":
        source = tree_layout.grpo_forest(
            rng, groups=2, n=8, prompt_len=(10, 20), completion_len=(2, 12)
        )
    else:
        source = tree_layout.multiturn_forest(rng, trees=2, depth=3, turn_len=(2, 8))
    rollouts = [source.rollout(r) for r in range(len(source.rollout_leaf))]
    ids = [torch.as_tensor(x) for x, _ in rollouts]
    masks = [torch.as_tensor(m) for _, m in rollouts]
    groups = [source.root_of(leaf) for leaf in source.rollout_leaf]
    return ids, masks, tree.build_forest(ids, groups)


def plan_forest(forest, cap, masks, **options):
    """packsched's plan of the forest's pieces under ``cap`` unique tokens, token_mean loss
    weights per rollout; ``options``: more planner options (align_to, align_total_to)."""
    return planner.plan_local(
        forest,
        cap,
        loss_tokens=[int(m[1:].sum()) for m in masks],
        loss_mode="token_mean",
        progress=False,
        **options,
    )


def tree_packed(model, forest, plan, sequences, masks, break_layout=None):
    """Every micro-batch of the tree ``plan`` as one tree-packed row through the model's
    "packsched_tree" attention (TreeRows.from_micro_batch, the depths as position ids), the
    loss by multi-target cross entropy over tree_targets with the plan's per-rollout weights.
    ``break_layout``: a broken contract for the negative controls, "siblings" (every row's
    subtree is its whole piece: a branch sees its siblings) or "positions" (position ids count
    rows, not depths). Returns (log-probabilities per rollout, rows forwarded)."""
    out = [None] * len(sequences)
    forwarded = 0
    for mb in plan.micro_batches:
        if len(mb.rollouts) == 0:
            continue
        rows = packsched_hf.TreeRows.from_micro_batch(mb, forest)
        position_ids = rows.position_ids
        if break_layout == "siblings":
            cu = rows.cu_seqlens_host
            ends = np.repeat(cu[1:], np.diff(cu))
            rows = packsched_hf.TreeRows.from_arrays(cu, ends, rows.positions, total=rows.total)
        elif break_layout == "positions":
            position_ids = torch.arange(rows.rows)[None]
        ids = torch.as_tensor(mb.input_ids(forest))
        logits = model(input_ids=ids[None], position_ids=position_ids, packsched_tree=rows)
        logits = logits.logits[0]
        held = [int(r) for r in mb.rollouts]
        rollout_rows = [mb.rollout_rows(forest, i) for i in range(len(held))]
        targets = tree_kernels.tree_targets(
            rollout_rows,
            [sequences[r].numpy() for r in held],
            [plan.loss_weights[r] for r in held],
            loss_masks=[masks[r].numpy() for r in held],
        )
        ce = kernels.multi_target_cross_entropy(
            logits, torch.as_tensor(targets.rows), torch.as_tensor(targets.labels)
        )
        (torch.as_tensor(targets.weights, dtype=ce.dtype) * ce).sum().backward()
        for r, logprobs in zip(held, tree_kernels.restore(-ce.detach(), targets.index)):
            out[r] = logprobs
        forwarded += rows.rows
    return out, forwarded


def max_difference(got, expected):
    """Largest |got - expected| over lists of tensors or dicts of tensors."""
    if isinstance(got, dict):
        assert got.keys() == expected.keys()
        got, expected = list(got.values()), [expected[k] for k in got]
    assert len(got) == len(expected)
    return max(_largest(a.double() - b.double()) for a, b in zip(got, expected))


def scale_of(values):
    """max(1, largest |entry|): the scale tolerances are relative to."""
    values = values.values() if isinstance(values, dict) else values
    return max(1.0, max(_largest(v.double()) for v in values))


def _largest(x):
    return float(x.abs().max()) if x.numel() else 0.0
