"""A tiny Qwen3 causal LM with random weights and a word-level tokenizer, built locally (nothing
downloaded), for the TRL and verl tests. Tokens are "t<i>"; 0 is the pad token, 1 the end of
sequence, 2 the start; ``VOCAB`` ids in all."""

import torch

VOCAB = 64
SEED = 0


def tiny_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
        architectures=["Qwen3ForCausalLM"],
    )


def tiny_model(attention="sdpa", seed=SEED):
    """The model in float32 with weights drawn from ``seed`` (the same for every call), running
    ``attention`` (a name in transformers' AttentionInterface)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(
        tiny_config(), attn_implementation=attention, dtype=torch.float32
    )


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )


def save_tiny(path, attention="sdpa"):
    """Writes the model and tokenizer to ``path`` (a local checkpoint); returns the model."""
    model = tiny_model(attention)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model
