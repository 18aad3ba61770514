"""A minimal transformers attention function that runs ``packsched.kernels.varlen_attention`` on
padding-free rows (TRL's collator passes ``cu_seq_lens_q``/``cu_seq_lens_k`` and
``max_length_q``/``max_length_k``). Local to the tests: ``packsched.integrations.transformers``
("packsched_varlen") is the library's own registration."""

from packsched.kernels import varlen_attention

VARLEN = "packsched_test_varlen"


def varlen_attention_forward(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """query [1, H, T, D], key/value [1, Hkv, T, D] (one padding-free row) -> ([1, T, H, D],
    None). Causal within each sequence of the row."""
    if query.shape[0] != 1 or kwargs.get("cu_seq_lens_q") is None:
        raise ValueError(f"{VARLEN} runs padding-free rows only (batch 1 with cu_seq_lens_q)")
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))
    out = varlen_attention(
        q,
        k,
        v,
        kwargs["cu_seq_lens_q"],
        kwargs["cu_seq_lens_k"],
        kwargs["max_length_q"],
        kwargs["max_length_k"],
        softmax_scale=scaling,
        causal=True,
    )
    return out.unsqueeze(0), None


def register_varlen():
    """Registers VARLEN with transformers (idempotent): the attention function, and the flash
    attention mask rule (no 4-D mask: the sequences come from cu_seq_lens)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(VARLEN, varlen_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN, flash_attention_mask)
