"""Tree packing for TRL's GRPOTrainer (trl 1.16), as small glue: a subclass whose per-token
log-probs come from packsched's tree packing (each prompt forwarded once for all its
completions) instead of TRL's padded [B, prompt + completion] rows.

TRL has no packing or padding-free option for GRPO and no collator to hook: generation, scoring
and the loss all call ``GRPOTrainer._get_per_token_logps_and_entropies(model, input_ids,
attention_mask, logits_to_keep, ...)`` on left-padded prompts followed by right-padded
completions (verl's layout), which runs ``model(input_ids, attention_mask, labels,
fused_lm_head=True)``. That private method is the one hook; overriding it covers the old, the
reference and the training log-probs alike. Text models only (the multimodal arguments and the
MoE aux loss go to TRL's own method). The attention is packsched's tree attention, registered
here as a minimal transformers attention function ("packsched_test_tree", sdpa for every call
that carries no tree, so the same model generates): a stand-in for
packsched.integrations.transformers' "packsched_tree".
"""

import torch

from packsched.compat.verl import tree_log_probs, tree_pack_batch, tree_unpack
from packsched.kernels import tree_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward

TREE = "packsched_test_tree"


def tree_attention_forward(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """query [1, H, T, D], key/value [1, Hkv, T, D]: one tree-packed row when the model call
    carries the tree as keyword arguments (``tree_subtree_end``, ``tree_cu_seqlens``,
    ``tree_max_seqlen``: the model hands them to every attention layer) -> ([1, T, H, D], None).
    Any other call (generation, TRL's padded rows) is transformers' sdpa attention."""
    if kwargs.get("tree_subtree_end") is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, **kwargs
        )
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))
    out = tree_attention(
        q,
        k,
        v,
        kwargs["tree_cu_seqlens"],
        kwargs["tree_max_seqlen"],
        kwargs["tree_subtree_end"],
        softmax_scale=scaling,
    )
    return out.unsqueeze(0), None


def register_tree_attention():
    """Registers TREE with transformers (idempotent), with sdpa's mask rule (its fallback's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(TREE, tree_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(TREE, sdpa_mask)


def prompt_groups(input_ids, attention_mask, logits_to_keep):
    """One group id per row: rows with the same prompt tokens share one (packsched's trie then
    forwards that prompt once)."""
    ids = {}
    prompt_ids = input_ids[:, :-logits_to_keep]
    prompt_mask = attention_mask[:, :-logits_to_keep].bool()
    return [
        ids.setdefault(tuple(row[mask].tolist()), len(ids))
        for row, mask in zip(prompt_ids, prompt_mask)
    ]


def tree_logps_and_entropies(
    model, input_ids, attention_mask, logits_to_keep, *, temperature, max_token_len, compute_entropy
):
    """GRPO's per-token log-probs [B, C] (and entropies) of the completion tokens, computed on
    tree-packed micro-batches of at most ``max_token_len`` forwarded tokens. The model's attention
    implementation must be TREE. Positions past a completion hold 0."""
    completion_mask = attention_mask[:, -logits_to_keep:]
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "response_mask": completion_mask,
    }
    uid = prompt_groups(input_ids, attention_mask, logits_to_keep)
    micro_batches, packing = tree_pack_batch(batch, max_token_len, uid=uid)
    logits = []
    for mb in micro_batches:
        out = model(
            input_ids=mb["input_ids"][None],
            position_ids=mb["position_ids"][None],
            tree_subtree_end=mb["subtree_end"],
            tree_cu_seqlens=mb["cu_seqlens"],
            tree_max_seqlen=mb["max_seqlen"],
            use_cache=False,
        )
        logits.append(out.logits[0].float())
    logps = tree_log_probs(logits, packing, temperature=temperature)
    entropies = None
    if compute_entropy:
        per_row = []
        for values in logits:
            log_p = torch.log_softmax(values / temperature, dim=-1)
            per_row.append(-(log_p.exp() * log_p).sum(dim=-1))
        entropies = tree_unpack(per_row, packing)
    return logps, entropies


def tree_grpo_trainer_class(max_token_len=4096):
    """A GRPOTrainer subclass whose text-only log-probs are tree-packed (see the module
    docstring). The model must run the TREE attention (register_tree_attention first)."""
    from trl import GRPOTrainer

    class TreeGRPOTrainer(GRPOTrainer):
        def _get_per_token_logps_and_entropies(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=None,
            compute_entropy=False,
            compute_aux_loss=False,
            **multimodal,
        ):
            if compute_aux_loss or any(value is not None for value in multimodal.values()):
                return super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size,
                    compute_entropy,
                    compute_aux_loss,
                    **multimodal,
                )
            with self.accelerator.autocast():
                logps, entropies = tree_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    temperature=self.temperature,
                    max_token_len=max_token_len,
                    compute_entropy=compute_entropy,
                )
            return logps, entropies, None

    return TreeGRPOTrainer
