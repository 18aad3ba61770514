"""TRL's GRPOTrainer with packsched's tree packing, through the glue in helpers/trl_tree_grpo.py
(one overridden method; tree attention registered as a minimal transformers attention function).

GRPO scores G completions of each prompt as G padded rows, each repeating the prompt. Tree-packed,
each prompt is forwarded once and its completions branch from it. The log-probs and entropies
must be TRL's own (float32, up to rounding), and a real GRPO run on the CPU (generation by
transformers, a reward function, a reference model for the KL term) must train exactly as TRL's
stock trainer does from the same seed.
"""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
pytest.importorskip("transformers")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
import trl_tree_grpo  # noqa: E402
from hf_tiny_lm import VOCAB, save_tiny, tiny_tokenizer  # noqa: E402
from trl_tree_grpo import TREE, register_tree_attention, tree_grpo_trainer_class  # noqa: E402

from packsched.compat.verl import tree_pack_batch  # noqa: E402

TOLERANCE = 1e-5  # float32: the same values from differently shaped matmuls and attention
GROUPS, G, PROMPT, COMPLETION = 3, 4, 7, 10


def grpo_rows(seed=1):
    """G completions per prompt as GRPO lays them out: left-padded prompts (repeated per row),
    right-padded completions of random lengths."""
    g = torch.Generator().manual_seed(seed)
    rows = GROUPS * G
    ids = torch.zeros(rows, PROMPT + COMPLETION, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for group in range(GROUPS):
        length = PROMPT - group  # a different left padding per group
        prompt = torch.randint(3, VOCAB, (length,), generator=g)
        for row in range(group * G, (group + 1) * G):
            ids[row, PROMPT - length : PROMPT] = prompt
            mask[row, PROMPT - length : PROMPT] = 1
            count = int(torch.randint(1, COMPLETION + 1, (1,), generator=g))
            ids[row, PROMPT : PROMPT + count] = torch.randint(3, VOCAB, (count,), generator=g)
            mask[row, PROMPT : PROMPT + count] = 1
    return ids, mask


def distinct_prefixes(ids, mask):
    """The tokens a trie per prompt group holds: each distinct prefix of a group's rows once."""
    prefixes = set()
    for row, (tokens, real) in enumerate(zip(ids, mask.bool())):
        tokens = tokens[real].tolist()
        prefixes.update((row // G, tuple(tokens[: k + 1])) for k in range(len(tokens)))
    return len(prefixes)


def grpo_trainer(cls, tmp_path, **config):
    register_tree_attention()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        optim="sgd",
        learning_rate=0.1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        bf16=False,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        model_init_kwargs={"attn_implementation": TREE, "dtype": torch.float32},
        **config,
    )
    save_tiny(tmp_path / "model")  # a local checkpoint: TRL loads the reference model from it
    prompts = datasets.Dataset.from_dict({"prompt": ["t5 t6 t7", "t9 t10", "t11 t12 t13", "t20"]})
    return cls(
        model=str(tmp_path / "model"),
        reward_funcs=lambda completions, **_: [
            c.split().count("t5") + 0.1 * len(c.split()) for c in completions
        ],
        args=args,
        train_dataset=prompts,
        processing_class=tiny_tokenizer(),
    )


def test_tree_packed_log_probs_are_trls(tmp_path):
    stock = grpo_trainer(trl.GRPOTrainer, tmp_path)
    ids, mask = grpo_rows()
    # Each prompt forwarded once: the packed tokens are the rows' tokens less G - 1 prompt copies.
    micro_batches, _ = tree_pack_batch(
        {"input_ids": ids, "attention_mask": mask, "response_mask": mask[:, PROMPT:]},
        4096,
        uid=trl_tree_grpo.prompt_groups(ids, mask, COMPLETION),
    )
    forwarded = sum(len(mb["input_ids"]) for mb in micro_batches)
    assert forwarded == distinct_prefixes(ids, mask)
    assert forwarded <= int(mask.sum()) - (G - 1) * int(mask[::G, :PROMPT].sum())
    with torch.no_grad():
        theirs = stock._get_per_token_logps_and_entropies(
            stock.model, ids, mask, COMPLETION, compute_entropy=True
        )
        ours = tree_grpo_trainer_class()._get_per_token_logps_and_entropies(
            stock, stock.model, ids, mask, COMPLETION, compute_entropy=True
        )
    completion = mask[:, PROMPT:].bool()
    assert ours[2] is None and theirs[2] is None
    for mine, trls in zip(ours[:2], theirs[:2]):
        torch.testing.assert_close(mine[completion], trls[completion], atol=TOLERANCE, rtol=0)


def test_grpo_trains_as_trl_does_with_tree_packing(tmp_path, monkeypatch):
    """Two GRPO steps (generate, score, KL to a reference model, SGD) from the same seed: TRL's
    trainer, then the tree-packed one. Same generations, so the same losses, KL and weights."""
    calls = []
    packed = trl_tree_grpo.tree_logps_and_entropies

    def counted(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return packed(*args, **kwargs)

    monkeypatch.setattr(trl_tree_grpo, "tree_logps_and_entropies", counted)
    stock = grpo_trainer(trl.GRPOTrainer, tmp_path / "stock", beta=0.04)
    stock.train()
    tree = grpo_trainer(tree_grpo_trainer_class(), tmp_path / "tree", beta=0.04)
    tree.train()
    # Per step: the reference model's log-probs (no grad) and the policy's (with grad).
    assert calls.count(True) == 2 and calls.count(False) == 2

    def logged(trainer):
        return [
            [entry[key] for key in ("loss", "kl", "entropy", "reward")]
            for entry in trainer.state.log_history
            if "loss" in entry
        ]

    assert len(logged(tree)) == 2
    for mine, trls in zip(logged(tree), logged(stock)):
        assert mine == pytest.approx(trls, abs=TOLERANCE)
    theirs = dict(stock.model.named_parameters())
    for name, weight in tree.model.named_parameters():
        torch.testing.assert_close(weight, theirs[name], atol=TOLERANCE, rtol=0, msg=name)
