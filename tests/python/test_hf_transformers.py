"""packsched.integrations.transformers: unchanged Hugging Face decoders (Qwen3, Llama, Qwen3-MoE,
Gemma2; tiny configs, random weights, nothing downloaded) run packed rows through
"packsched_varlen" and tree-packed rows through "packsched_tree", planned by packsched's planner,
and give every sequence's per-token log-probabilities and every parameter's gradient of the
same model run one sequence at a time with transformers' own attention: within 1e-10 in float64
and 1e-5 in float32 (relative to max(1, the largest entry)). The reference is "sdpa", which
computes in the model's dtype; "eager" rounds its softmax to float32 even in a float64 model,
so Gemma2 (softcap, which sdpa ignores) is compared with eager at 2e-6. Negative controls: the
same comparisons fail when the sequences of a row see each other, when a branch sees its
sibling, when the depths are not the position ids, and when the window or the softcap is lost.
"""

import importlib
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "helpers"))

import hf_packing as hf  # noqa: E402
from packsched.integrations import transformers as packsched_hf  # noqa: E402

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
EAGER_FLOAT64 = 2e-6  # eager's softmax is float32 in any model dtype
BROKEN = 1e-3  # a broken layout differs by more than this (the observed differences are > 0.1)
CAP = 64  # tokens per micro-batch: several micro-batches


def assert_close(got, expected, tolerance, what):
    error = hf.max_difference(got, expected)
    assert error <= tolerance * hf.scale_of(expected), f"{what}: max error {error:.3g}"
    return error


def assert_differs(got, expected, what):
    error = hf.max_difference(got, expected)
    assert error > BROKEN * hf.scale_of(expected), f"{what}: the broken layout went unnoticed"


def sequences_and_masks(seed, count=10):
    rng = np.random.default_rng(seed)
    sequences = hf.random_sequences(rng, count)
    # The first few tokens are a prompt (not trained): the loss mask matters.
    masks = [torch.arange(len(s)) >= int(rng.integers(0, len(s))) for s in sequences]
    return sequences, masks


def test_register_returns_the_names_and_needs_transformers_only_when_called(monkeypatch):
    assert packsched_hf.register() == ("packsched_varlen", "packsched_tree")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name in ("packsched_varlen", "packsched_tree"):
        assert name in AttentionInterface._global_mapping
        assert name in AttentionMaskInterface._global_mapping
    # Without transformers the module still imports; register() says what is missing.
    monkeypatch.setitem(sys.modules, "transformers", None)
    module = importlib.reload(packsched_hf)
    with pytest.raises(ImportError):
        module.register()
    # And packsched itself never imports it (nor torch).
    code = (
        "import sys, packsched, packsched.integrations\n"
        "print(sorted({'transformers', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_packed_rows_equal_each_sequence_on_its_own(kind, dtype):
    sequences, masks = sequences_and_masks(seed=1)
    plan = hf.plan_rows([len(s) for s in sequences], CAP, masks)
    assert plan.num_micro_batches >= 2
    model = hf.tiny_model(kind, dtype, "packsched_varlen")
    logprobs = hf.packed(model, sequences, plan, masks)
    grads = hf.gradients(model)
    ref_logprobs = hf.per_sequence(model, sequences, plan.loss_weights, masks)
    ref_grads = hf.gradients(model)
    assert_close(logprobs, ref_logprobs, TOLERANCE[dtype], "log-probabilities")
    assert_close(grads, ref_grads, TOLERANCE[dtype], "gradients")
    assert hf.scale_of(ref_grads) > 0 and max(float(g.abs().max()) for g in grads.values()) > 0

    # Negative control: one row whose position ids count on across the sequences (no offsets)
    # lets them see each other.
    broken = hf.packed(model, sequences, plan, masks, break_boundaries=True)
    assert_differs(broken, ref_logprobs, "sequences leaking across the row")


@pytest.mark.parametrize("offsets", ["host lists", "int32 tensors"])
def test_packed_rows_from_flash_attention_kwargs(offsets):
    sequences, masks = sequences_and_masks(seed=2)
    plan = hf.plan_rows([len(s) for s in sequences], CAP, masks)
    model = hf.tiny_model("qwen3", torch.float64, "packsched_varlen")
    logprobs = hf.packed(model, sequences, plan, masks, layout="cu_seq_lens", offsets=offsets)
    grads = hf.gradients(model)
    ref_logprobs = hf.per_sequence(model, sequences, plan.loss_weights, masks)
    assert_close(logprobs, ref_logprobs, 1e-10, "log-probabilities")
    assert_close(grads, hf.gradients(model), 1e-10, "gradients")


@pytest.mark.parametrize("flash_kwargs", [False, True])
def test_transformers_flattening_collator_and_its_loss(flash_kwargs):
    """transformers' own padding-free batch (DataCollatorWithFlattening: position ids, and with
    flash_kwargs cu_seq_lens_q/k) and the model's own loss (the token mean) give the loss and
    the gradient of the sequences run one at a time with the same loss. transformers' loss casts
    the logits to float32, hence 1e-6 in a float64 model."""
    from transformers import DataCollatorWithFlattening

    sequences, _ = sequences_and_masks(seed=7, count=6)
    collate = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)
    batch = collate([{"input_ids": s.tolist()} for s in sequences])
    assert ("cu_seq_lens_q" in batch) == flash_kwargs
    model = hf.tiny_model("qwen3", torch.float64, "packsched_varlen")
    loss = model(**batch).loss
    loss.backward()
    grads = hf.gradients(model)
    model.set_attn_implementation("sdpa")
    count = sum(len(s) - 1 for s in sequences)
    expected = sum(
        model(input_ids=s[None], labels=s[None], num_items_in_batch=count).loss for s in sequences
    )
    expected.backward()
    assert_close([loss.detach()], [expected.detach()], 1e-6, "loss")
    assert_close(grads, hf.gradients(model), 1e-6, "gradients")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("shape", ["grpo", "multiturn"])
def test_tree_packed_rows_equal_each_rollout_on_its_own(shape, kind, dtype):
    sequences, masks, forest = hf.forest_rollouts(shape, seed=3)
    # The forest build_forest made from the token ids shares every common prefix: one prompt
    # node per GRPO group (n = 8) above its completions; multi-turn paths of at least four
    # nodes (the prompt, then turns where rollouts branch or end).
    depth = max(len(forest.path(r)) for r in range(forest.num_rollouts))
    assert depth == 2 if shape == "grpo" else depth >= 4
    plan = hf.plan_forest(forest, 2 * CAP, masks)
    assert plan.num_micro_batches >= 2 and not plan.dropped
    model = hf.tiny_model(kind, dtype, "packsched_tree")
    logprobs, forwarded = hf.tree_packed(model, forest, plan, sequences, masks)
    grads = hf.gradients(model)
    assert forwarded < forest.rollout_tokens  # each shared token forwarded once per piece
    ref_logprobs = hf.per_sequence(model, sequences, plan.loss_weights, masks)
    ref_grads = hf.gradients(model)
    assert_close(logprobs, ref_logprobs, TOLERANCE[dtype], "log-probabilities")
    assert_close(grads, ref_grads, TOLERANCE[dtype], "gradients")

    if dtype == torch.float64:  # negative controls: a broken tree layout is caught
        for broken in ("siblings", "positions"):
            got, _ = hf.tree_packed(model, forest, plan, sequences, masks, break_layout=broken)
            hf.gradients(model)
            assert_differs(got, ref_logprobs, f"tree layout broken ({broken})")


def test_tree_packed_rows_with_aligned_pieces_and_a_tail():
    """Pieces padded to a multiple of 4 rows and micro-batches to a multiple of 32 (Ulysses):
    the padding and the tail (TreeRows.total) never reach a real row."""
    sequences, masks, forest = hf.forest_rollouts("multiturn", seed=3)
    plan = hf.plan_forest(forest, 2 * CAP, masks, align_to=4, align_total_to=32)
    metas = [mb.meta for mb in plan.micro_batches]
    assert any(m.cu_seqlens_aligned != m.cu_seqlens for m in metas)
    assert any(m.total > m.cu_seqlens_aligned[-1] for m in metas)
    model = hf.tiny_model("qwen3", torch.float64, "packsched_tree")
    logprobs, _ = hf.tree_packed(model, forest, plan, sequences, masks)
    grads = hf.gradients(model)
    ref_logprobs = hf.per_sequence(model, sequences, plan.loss_weights, masks)
    assert_close(logprobs, ref_logprobs, 1e-10, "log-probabilities")
    assert_close(grads, hf.gradients(model), 1e-10, "gradients")


def test_moe_packed_rows_equal_each_sequence_on_its_own():
    sequences, masks = sequences_and_masks(seed=4)
    plan = hf.plan_rows([len(s) for s in sequences], CAP, masks)
    model = hf.tiny_model("qwen3_moe", torch.float64, "packsched_varlen")
    logprobs = hf.packed(model, sequences, plan, masks)
    grads = hf.gradients(model)
    ref_logprobs = hf.per_sequence(model, sequences, plan.loss_weights, masks)
    assert_close(logprobs, ref_logprobs, 1e-10, "log-probabilities")
    assert_close(grads, hf.gradients(model), 1e-10, "gradients")


def lose(model, attribute):
    """Breaks the contract on purpose: the attention layers stop passing the sliding window or
    the softcap (as an integration ignoring them would)."""
    for layer in model.model.layers:
        setattr(layer.self_attn, attribute, None)


@pytest.mark.parametrize("rows", ["packed", "tree"])
def test_gemma2_sliding_window_and_softcap(rows):
    if rows == "packed":
        sequences, masks = sequences_and_masks(seed=5)
        plan = hf.plan_rows([len(s) for s in sequences], CAP, masks)
    else:
        sequences, masks, forest = hf.forest_rollouts("multiturn", seed=5)
        plan = hf.plan_forest(forest, 2 * CAP, masks)

    def run(model):
        if rows == "packed":
            return hf.packed(model, sequences, plan, masks)
        return hf.tree_packed(model, forest, plan, sequences, masks)[0]

    implementation = "packsched_varlen" if rows == "packed" else "packsched_tree"
    model = hf.tiny_model("gemma2", torch.float64, implementation)
    assert max(len(s) for s in sequences) > 2 * model.config.sliding_window
    logprobs = run(model)
    grads = hf.gradients(model)
    ref_logprobs = hf.per_sequence(model, sequences, plan.loss_weights, masks, "eager")
    assert_close(logprobs, ref_logprobs, EAGER_FLOAT64, "log-probabilities")
    assert_close(grads, hf.gradients(model), EAGER_FLOAT64, "gradients")
    for attribute in ("sliding_window", "attn_logit_softcapping"):
        broken = hf.tiny_model("gemma2", torch.float64, implementation)
        lose(broken, attribute)
        assert_differs(run(broken), ref_logprobs, f"{attribute} lost")


def test_batch_of_rows_each_one_sequence_or_packed():
    model = hf.tiny_model("llama", torch.float64, "packsched_varlen")
    batch = torch.randint(0, hf.VOCAB, (2, 12), generator=torch.Generator().manual_seed(6))
    rows = list(batch)
    # Each row one sequence (no position_ids: the model's default arange).
    logits = model(input_ids=batch).logits
    model.set_attn_implementation("sdpa")
    expected = torch.cat([model(input_ids=r[None]).logits for r in rows])
    assert_close([logits.detach()], [expected.detach()], 1e-10, "rows")
    # Each row two packed sequences of 5 and 7 tokens.
    position_ids = torch.cat([torch.arange(5), torch.arange(7)]).expand(2, -1)
    expected = torch.cat(
        [
            torch.cat([model(input_ids=r[None, :5]).logits, model(input_ids=r[None, 5:]).logits], 1)
            for r in rows
        ]
    )
    model.set_attn_implementation("packsched_varlen")
    logits = model(input_ids=batch, position_ids=position_ids).logits
    assert_close([logits.detach()], [expected.detach()], 1e-10, "packed rows")


def test_unsupported_inputs_raise_a_clear_value_error():
    model = hf.tiny_model("qwen3", torch.float64, "packsched_varlen")
    ids = torch.randint(0, hf.VOCAB, (1, 9), generator=torch.Generator().manual_seed(9))
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]])
    padding = torch.ones(1, 9, dtype=torch.long)
    padding[0, -2:] = 0
    with pytest.raises(ValueError, match="padding mask"):
        model(input_ids=ids, attention_mask=padding)
    with pytest.raises(ValueError, match="4-D attention mask"):
        model(input_ids=ids, attention_mask=torch.zeros(1, 1, 9, 9, dtype=torch.float64))
    # A mask of ones is no padding: the same as none.
    ones = model(input_ids=ids, position_ids=position_ids, attention_mask=torch.ones(1, 9)).logits
    plain = model(input_ids=ids, position_ids=position_ids).logits
    assert torch.equal(ones, plain)
    with pytest.raises(ValueError, match="packsched_tree was given"):
        model(input_ids=ids, packsched_tree=object())
    with pytest.raises(ValueError, match="3-D rotary"):  # called as a model's layer calls it
        q = torch.zeros(1, 4, 9, 16, dtype=torch.float64)
        attention = model.model.layers[0].self_attn
        rotary_3d = torch.zeros(3, 1, 9, dtype=torch.long)
        packsched_hf.packed_attention(attention, q, q, q, None, position_ids=rotary_3d)
    with pytest.raises(ValueError, match="must run from 0"):
        model(input_ids=ids, cu_seq_lens_q=[0, 4, 8], cu_seq_lens_k=[0, 4, 8])
    with pytest.raises(ValueError, match="KV cache"):
        model.generate(ids, max_new_tokens=2, do_sample=False, use_cache=True)
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids=ids, output_attentions=True)
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(ValueError, match="attention dropout"):
        model(input_ids=ids)
    model.eval()  # no dropout at evaluation: runs
    model(input_ids=ids)

    tree_model = hf.tiny_model("qwen3", torch.float64, "packsched_tree")
    with pytest.raises(ValueError, match="packsched_tree=TreeRows"):
        tree_model(input_ids=ids)
    rows = packsched_hf.TreeRows.from_arrays([0, 4, 9], [4, 4, 4, 4, 9, 9, 9, 9, 9])
    assert rows.positions.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4]
    tree_model(input_ids=ids, position_ids=rows.position_ids, packsched_tree=rows)
    with pytest.raises(ValueError, match="one row of the layout's rows"):
        tree_model(input_ids=ids.expand(2, -1), packsched_tree=rows)
    with pytest.raises(ValueError, match="one row of the layout's rows"):
        tree_model(input_ids=ids[:, :8], packsched_tree=rows)
    bad = packsched_hf.TreeRows(  # row 4's subtree ends before it: the kernel names the row
        rows.cu_seqlens,
        rows.cu_seqlens_host,
        rows.max_seqlen,
        torch.tensor([4, 4, 4, 4, 3, 9, 9, 9, 9], dtype=torch.int32),
        rows.positions,
    )
    with pytest.raises(ValueError, match=r"subtree_end\[4\] = 3"):
        tree_model(input_ids=ids, packsched_tree=bad)
    with pytest.raises(ValueError, match="subtree_end has 8 entries for 9 rows"):
        packsched_hf.TreeRows.from_arrays([0, 9], [9] * 8)


def test_position_ids_changed_in_place_give_their_new_sequences():
    """The offsets derived from a position_ids tensor are reused across layers, never across an
    in-place change."""
    model = hf.tiny_model("qwen3", torch.float64, "packsched_varlen")
    ids = torch.randint(0, hf.VOCAB, (1, 10), generator=torch.Generator().manual_seed(8))
    position_ids = torch.arange(10)[None]
    one_sequence = model(input_ids=ids, position_ids=position_ids).logits
    position_ids[0, 5:] = torch.arange(5)
    two_sequences = model(input_ids=ids, position_ids=position_ids).logits
    expected = model(input_ids=ids, position_ids=position_ids.clone()).logits
    assert torch.equal(two_sequences, expected)
    assert not torch.allclose(one_sequence[0, 5:], two_sequences[0, 5:])
