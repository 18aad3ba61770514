"""packsched.compat.verl's tree packing: a verl batch to tree-packed micro-batches and back."""

import numpy as np
import pytest
import torch

from packsched.compat import verl


def verl_batch(seed, groups=3, n=4, prompt_width=12, response_width=9):
    """Left-padded prompts shared by each group's n rows, right-padded responses that share a
    first token within a group half the time."""
    rng = np.random.default_rng(seed)
    rows, masks, resp_masks, uids = [], [], [], []
    for g in range(groups):
        plen = int(rng.integers(1, prompt_width + 1))
        prompt = rng.integers(3, 50, plen)
        shared = int(rng.integers(3, 50))
        for _ in range(n):
            rlen = int(rng.integers(1, response_width + 1))
            response = rng.integers(3, 50, rlen)
            if rng.random() < 0.5:
                response[0] = shared
            ids = np.zeros(prompt_width + response_width, dtype=np.int64)
            mask = np.zeros_like(ids)
            ids[prompt_width - plen : prompt_width] = prompt
            mask[prompt_width - plen : prompt_width] = 1
            ids[prompt_width : prompt_width + rlen] = response
            mask[prompt_width : prompt_width + rlen] = 1
            resp_mask = np.zeros(response_width, dtype=np.int64)
            resp_mask[:rlen] = 1
            resp_mask[0] = 0 if rng.random() < 0.3 else 1  # a token the loss skips
            rows.append(ids)
            masks.append(mask)
            resp_masks.append(resp_mask)
            uids.append(f"prompt-{g}")
    order = rng.permutation(len(rows))  # groups interleaved, as after a shuffle
    batch = {
        "input_ids": torch.as_tensor(np.stack(rows)[order]),
        "attention_mask": torch.as_tensor(np.stack(masks)[order]),
        "response_mask": torch.as_tensor(np.stack(resp_masks)[order]),
    }
    return batch, np.array(uids, dtype=object)[order]


@pytest.mark.parametrize("seed, cap", [(0, 64), (1, 32), (2, 24)])
def test_pack_and_unpack_round_trip(seed, cap):
    batch, uid = verl_batch(seed)
    mbs, packing = verl.tree_pack_batch(batch, cap, uid=uid)
    ids = batch["input_ids"]
    b, s = ids.shape
    r = batch["response_mask"].shape[1]
    assert sorted(np.concatenate(packing.rows).tolist()) == list(range(b))
    # Shared prompts are forwarded once per piece: fewer rows than the rows' tokens.
    assert sum(int(m["cu_seqlens"][-1]) for m in mbs) < int(batch["attention_mask"].sum())
    # Each packed row's token and position, unpacked to the response layout, is the token before
    # each response token and its index in the original row.
    tokens = verl.tree_unpack([m["input_ids"] for m in mbs], packing, fill=-1)
    positions = verl.tree_unpack([m["position_ids"] for m in mbs], packing, fill=-1)
    for row in range(b):
        real = ids[row][batch["attention_mask"][row] != 0]
        plen = int(batch["attention_mask"][row, : s - r].sum())
        for j in range(int(batch["attention_mask"][row, s - r :].sum())):
            if plen + j == 0:
                continue
            assert tokens[row, j] == real[plen + j - 1]
            assert positions[row, j] == plen + j - 1
        assert torch.all(tokens[row, int(batch["attention_mask"][row, s - r :].sum()) :] == -1)


def test_log_probs_match_the_unpacked_rows():
    # A position-wise model (logits from the token alone) gives each response token the same
    # log-prob packed or not; the branching rows give each child its own label.
    torch.manual_seed(0)
    batch, uid = verl_batch(3)
    table = torch.randn(64, 64, dtype=torch.float64, requires_grad=True)
    mbs, packing = verl.tree_pack_batch(batch, 48, uid=uid)
    lp = verl.tree_log_probs([table[m["input_ids"]] for m in mbs], packing)
    ids = batch["input_ids"]
    s, r = ids.shape[1], batch["response_mask"].shape[1]
    want = torch.zeros_like(lp)
    for row in range(ids.shape[0]):
        logits = torch.log_softmax(table[ids[row, s - r - 1 : s - 1]], dim=-1)
        count = int(batch["attention_mask"][row, s - r :].sum())
        want[row, :count] = logits[:count].gather(-1, ids[row, s - r : s - r + count, None])[:, 0]
    assert torch.allclose(lp, want)
    lp.sum().backward()
    assert table.grad is not None and table.grad.abs().sum() > 0


def test_loss_weights_per_row_match_flat_packing():
    batch, uid = verl_batch(4)
    _, packing = verl.tree_pack_batch(batch, 64, uid=uid, loss_mode="sample_mean")
    tokens = batch["response_mask"].sum(dim=1).numpy()
    want = np.where(tokens > 0, 1.0 / (np.maximum(tokens, 1) * np.count_nonzero(tokens)), 0.0)
    assert np.allclose(packing.loss_weights, want)
