"""verl's real FSDP engine on the CPU, with verl's seqlen_balancing and with packsched's drop-in.

verl 0.9.1's actor computes log-probs (``compute_log_prob``) and trains (``update_actor``) through
``FSDPEngineWithLMHead.forward_backward_batch``, whose dynamic batching calls
``rearrange_micro_batches`` and ``restore_dynamic_batch`` from ``verl.utils.seqlen_balancing``
(imported into ``verl.workers.engine.utils``). Here the real engine (FSDP2 on a one-process gloo
group, a tiny Qwen3 saved to a local checkpoint, sdpa attention over verl's padding-free rows) runs
a trainer-shaped batch (left-padded prompts, right-padded responses, converted by verl's own
``left_right_2_no_padding``) once with verl's module and once with packsched's swapped in, and
the test checks: the same log-probs (and the same ones as each sequence run alone), the same
training loss and gradients, and every micro-batch within max_token_len (observed by wrapping
the function the engine calls). What verl needs to run on a CPU at all is in helpers/verl_cpu.py.
Ray is not started. The documented swap (``sys.modules``) is checked in a fresh interpreter.
"""

import functools
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

verl = pytest.importorskip("verl")
pytest.importorskip("tensordict")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import packsched.compat.verl as packsched_verl  # noqa: E402

HELPERS = Path(__file__).parent / "helpers"
sys.path.insert(0, str(HELPERS))
from hf_tiny_lm import VOCAB, save_tiny, tiny_model  # noqa: E402
from verl_cpu import skip_trl_value_head_patch, use_cpu_platform  # noqa: E402

PROMPT, RESPONSE, ROWS = 24, 40, 16
# float32 throughout; the two modules put the sequences in different micro-batches, so the same
# values come out of matmuls of other shapes: equal up to rounding.
TOLERANCE = 1e-5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """verl's FSDPEngineWithLMHead, initialised on the CPU (float32, no torch.compile)."""
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    use_cpu_platform()
    with pytest.MonkeyPatch.context() as patch:
        skip_trl_value_head_patch(patch)
        from verl.trainer.config import CheckpointConfig
        from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

        path = tmp_path_factory.mktemp("tiny_qwen3")
        save_tiny(path)
        fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
        built = FSDPEngineWithLMHead(
            HFModelConfig(
                path=str(path),
                override_config={"attn_implementation": "sdpa"},
                enable_gradient_checkpointing=False,
            ),
            FSDPEngineConfig(strategy="fsdp2", use_torch_compile=False, mixed_precision=fp32),
            FSDPOptimizerConfig(lr=1e-3),
            CheckpointConfig(),
        )
        built.initialize()
    yield built
    if created:
        dist.destroy_process_group()


def trainer_batch(seed=3):
    """A batch as verl's trainer hands it to the actor: a DataProto of left-padded prompts and
    right-padded responses, turned into the padding-free TensorDict by verl's own conversion."""
    from verl.protocol import DataProto
    from verl.workers.utils.padding import left_right_2_no_padding

    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, PROMPT + 1, (ROWS,), generator=g)
    response_len = torch.randint(1, RESPONSE + 1, (ROWS,), generator=g)
    prompts = torch.zeros(ROWS, PROMPT, dtype=torch.long)
    responses = torch.zeros(ROWS, RESPONSE, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompts)
    response_mask = torch.zeros_like(responses)
    for i in range(ROWS):
        p, r = int(prompt_len[i]), int(response_len[i])
        prompts[i, PROMPT - p :] = torch.randint(3, VOCAB, (p,), generator=g)
        prompt_mask[i, PROMPT - p :] = 1
        responses[i, :r] = torch.randint(3, VOCAB, (r,), generator=g)
        response_mask[i, :r] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    data = DataProto.from_dict(
        tensors=dict(
            prompts=prompts,
            responses=responses,
            input_ids=torch.cat([prompts, responses], dim=1),
            attention_mask=attention_mask,
            position_ids=(attention_mask.cumsum(1) - 1).clamp(min=0),
            response_mask=response_mask,
        ),
        meta_info={"temperature": 1.0},
    )
    return left_right_2_no_padding(data.to_tensordict())


def with_settings(batch, max_token_len, **settings):
    """The batch with the non-tensor settings verl's worker adds (TrainingWorker.infer_batch)."""
    from verl.utils import tensordict_utils as tu

    batch = batch.clone()
    tu.assign_non_tensor(
        batch,
        use_remove_padding=True,
        use_dynamic_bsz=True,
        max_token_len_per_gpu=max_token_len,
        **settings,
    )
    return batch


def run(engine, monkeypatch, module, call):
    """``call()`` with the engine's dynamic batching taken from ``module`` (verl's
    seqlen_balancing or packsched.compat.verl), as the engine module imported it. Returns
    (call's result, the token count of every micro-batch the engine got)."""
    import verl.workers.engine.utils as engine_utils

    tokens = []

    @functools.wraps(module.rearrange_micro_batches)
    def observed(*args, **kwargs):
        micro_batches, indices = module.rearrange_micro_batches(*args, **kwargs)
        tokens.extend(int(mb["input_ids"].offsets()[-1]) for mb in micro_batches)
        return micro_batches, indices

    with monkeypatch.context() as patch:
        patch.setattr(engine_utils, "rearrange_micro_batches", observed)
        patch.setattr(engine_utils, "restore_dynamic_batch", module.restore_dynamic_batch)
        return call(), tokens


def response_log_probs(engine, batch):
    """verl's actor.compute_log_prob: the engine's log-probs of the response tokens [B, R]."""
    from verl.workers.utils.padding import no_padding_2_padding

    with engine.eval_mode():
        output = engine.infer_batch(batch, loss_function=None)
    return no_padding_2_padding(output["model_output"]["log_probs"], batch)


def alone_log_probs(batch):
    """Each row's response log-probs from the same weights, the row run on its own (no packing,
    no verl): the reference both modules must reproduce."""
    model = tiny_model("sdpa").eval()
    out = torch.zeros(ROWS, RESPONSE)
    for i, ids in enumerate(batch["input_ids"].unbind()):
        r = int(batch["response_mask"][i].sum())  # the last r of the row's tokens
        with torch.no_grad():
            logits = model(input_ids=ids[None], use_cache=False).logits[0]
        lp = torch.log_softmax(logits.float(), dim=-1)[:-1].gather(1, ids[1:, None])[:, 0]
        out[i, :r] = lp[len(ids) - 1 - r :]
    return out


@pytest.mark.parametrize("max_token_len", [64, 100, 256])
def test_log_probs_match_verls_and_the_cap_holds(engine, monkeypatch, max_token_len):
    from verl.utils import seqlen_balancing

    batch = with_settings(trainer_batch(), max_token_len)
    lengths = batch["input_ids"].offsets().diff()
    assert int(lengths.max()) <= max_token_len < int(lengths.sum())  # several micro-batches
    theirs, their_tokens = run(
        engine, monkeypatch, seqlen_balancing, lambda: response_log_probs(engine, batch)
    )
    ours, our_tokens = run(
        engine, monkeypatch, packsched_verl, lambda: response_log_probs(engine, batch)
    )
    assert sum(our_tokens) == sum(their_tokens) == int(lengths.sum())
    assert max(our_tokens) <= max_token_len and max(their_tokens) <= max_token_len
    assert len(our_tokens) >= -(-int(lengths.sum()) // max_token_len)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(ours[mask], theirs[mask], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(ours[mask], alone_log_probs(batch)[mask], atol=TOLERANCE, rtol=0)


def test_training_loss_and_gradients_match_verls(engine, monkeypatch):
    """The training path (update_actor, verl's SFT trainer): forward_backward_batch with verl's
    sft_loss and backward over the micro-batches."""
    from verl.utils import seqlen_balancing
    from verl.workers.utils.losses import sft_loss

    batch = with_settings(trainer_batch(seed=5), 80)
    # verl's SFT batches mark the trained tokens over the whole row, nested like input_ids: here
    # the responses (left_right_2_no_padding leaves the [B, R] response mask instead).
    rows = batch["input_ids"].unbind()
    counts = batch["response_mask"].sum(dim=1).tolist()
    batch["loss_mask"] = torch.nested.as_nested_tensor(
        [torch.arange(len(row)) >= len(row) - r for row, r in zip(rows, counts)],
        layout=torch.jagged,
    ).to(torch.int64)
    loss_fn = functools.partial(sft_loss, None)

    def step():
        with engine.train_mode():  # zeroes the gradients on exit
            engine.optimizer_zero_grad()
            out = engine.forward_backward_batch(batch.clone(), loss_fn, forward_only=False)
            grads = {
                name: p.grad.full_tensor().clone()
                for name, p in engine.module.named_parameters()
                if p.grad is not None
            }
        return sum(out["loss"]), grads

    (their_loss, their_grads), their_tokens = run(engine, monkeypatch, seqlen_balancing, step)
    (our_loss, our_grads), our_tokens = run(engine, monkeypatch, packsched_verl, step)
    assert max(our_tokens) <= 80 and max(their_tokens) <= 80
    assert np.isfinite(our_loss) and our_loss == pytest.approx(their_loss, abs=TOLERANCE)
    assert our_grads.keys() == their_grads.keys() and our_grads
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, their_grads[name], atol=TOLERANCE, rtol=1e-4, msg=name)


SWAP = """
import sys
import packsched.compat.verl
sys.modules["verl.utils.seqlen_balancing"] = packsched.compat.verl
import verl.workers.engine.utils as engine_utils
import verl.workers.engine.fsdp.transformer_impl  # noqa: F401  (imports ceildiv)
import verl.utils.seqlen_balancing as balancing
assert engine_utils.rearrange_micro_batches is packsched.compat.verl.rearrange_micro_batches
assert engine_utils.restore_dynamic_batch is packsched.compat.verl.restore_dynamic_batch
assert balancing is packsched.compat.verl
print("swapped")
"""


def test_the_documented_swap_reaches_verls_engine():
    """docs/operating.md's one line, in a fresh interpreter: verl's engine then imports packsched's
    functions, and the FSDP engine module finds the names it imports."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, "-c", SWAP], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("swapped")
