#!/usr/bin/env python3
"""Tree packing in plain torch: a GRPO batch (prompts with n completions each) trained with each
prompt forwarded once, and the gradient of the unshared batch.

A group is one tree: its prompt, then each completion, packed as one sequence (a piece). The
kernels do the rest (docs/design.md, "Tree packing"):
  - attention: packsched.kernels.tree_attention with subtree_end (a completion's rows see the
    prompt and themselves, never a sibling),
  - positions: each token's depth (packsched.kernels.tree_position_ids), as in its own rollout,
  - loss: packsched.tree_kernels.tree_targets turns each rollout's tokens and loss weight into
    (row, label, weight) targets (the prompt's last row predicts every completion's first
    token), packsched.kernels.multi_target_cross_entropy computes them,
  - restore: per-rollout log-probabilities back in each rollout's order (tree_kernels.restore).

Run it to see the float64 gradient against the padded per-rollout batch and a few SGD steps:

    PYTHONPATH=build/python .venv/bin/python client/python/examples/tree_packing.py
"""

import math
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import tiny_lm  # noqa: E402
from packsched import kernels, tree_kernels  # noqa: E402


class GroupLayout:
    """The packed layout of GRPO groups, one piece per group: ``ids``, ``positions``,
    ``subtree_end`` [T]; ``cu`` (piece offsets); per rollout held (``rollouts``, indices into the
    batch) its packed rows ``rows``."""

    def __init__(self, groups, prompt_lens, ids):
        """groups: lists of rollout indices sharing a prompt of prompt_lens[g] tokens (the
        first tokens of each of its rollouts); ids: every rollout's token ids."""
        self.ids, self.positions, self.subtree_end, self.cu = [], [], [], [0]
        self.rollouts, self.rows = [], []
        for group, prompt in zip(groups, prompt_lens):
            start = len(self.ids)
            end = start + prompt + sum(len(ids[r]) - prompt for r in group)
            self.ids.extend(ids[group[0]][:prompt].tolist())
            self.positions.extend(range(prompt))
            self.subtree_end.extend([end] * prompt)
            for r in group:
                first = len(self.ids)
                completion = ids[r][prompt:]
                self.ids.extend(completion.tolist())
                self.positions.extend(range(prompt, len(ids[r])))
                self.subtree_end.extend([first + len(completion)] * len(completion))
                self.rollouts.append(r)
                self.rows.append(np.r_[start : start + prompt, first : first + len(completion)])
            self.cu.append(end)

    def tensors(self):
        return (
            torch.tensor(self.ids, dtype=torch.int64),
            torch.tensor(self.positions, dtype=torch.int64),
            torch.tensor(self.cu, dtype=torch.int32),
            torch.tensor(self.subtree_end, dtype=torch.int32),
        )


def forward_tree(model, ids, positions, cu_seqlens, cu_seqlens_host, subtree_end):
    """TinyCausalLM's packed forward with tree attention: logits [T, vocab]."""
    max_seqlen = max(b - a for a, b in zip(cu_seqlens_host, cu_seqlens_host[1:]))
    x = model.embed(ids) + model.pos(positions)
    q, k, v = model._qkv(model.norm1(x))
    a = kernels.tree_attention(
        q, k, v, cu_seqlens, max_seqlen, subtree_end, cu_seqlens_host=cu_seqlens_host
    )
    x = x + model.out(a.reshape(len(ids), -1))
    return model.head(x + model.mlp(model.norm2(x)))


def tree_loss(model, layout, targets):
    """sum over targets of weight * CE: the micro-batch's share of the objective. ``layout``
    has ids, positions, cu, subtree_end (and rows); ``targets`` is a TreeTargets."""
    ids = torch.as_tensor(np.asarray(layout.ids), dtype=torch.int64)
    positions = torch.as_tensor(np.asarray(layout.positions), dtype=torch.int64)
    cu = torch.as_tensor(np.asarray(layout.cu), dtype=torch.int32)
    subtree_end = torch.as_tensor(np.asarray(layout.subtree_end), dtype=torch.int32)
    logits = forward_tree(model, ids, positions, cu, list(layout.cu), subtree_end)
    loss = kernels.multi_target_cross_entropy(
        logits, torch.as_tensor(targets.rows), torch.as_tensor(targets.labels)
    )
    return (loss * torch.as_tensor(targets.weights, dtype=loss.dtype)).sum(), loss


def targets_of(layout, ids, masks, weights):
    """The micro-batch's targets: rollout r (layout.rollouts) with its tokens, loss mask and loss
    weight (the plan's loss_weights[r], any loss mode)."""
    return tree_kernels.tree_targets(
        layout.rows,
        [ids[r].numpy() for r in layout.rollouts],
        [weights[r] for r in layout.rollouts],
        loss_masks=[masks[r].numpy() for r in layout.rollouts],
    )


def pack_groups(groups, prompt_lens, ids, cap):
    """Micro-batches of whole groups, first-fit decreasing by their unique tokens under ``cap``
    (a group over the cap gets a micro-batch of its own): one GroupLayout each."""
    sizes = [p + sum(len(ids[r]) - p for r in g) for g, p in zip(groups, prompt_lens)]
    bins = []
    for i in sorted(range(len(groups)), key=lambda i: -sizes[i]):
        for b in bins:
            if b[0] + sizes[i] <= cap:
                b[0] += sizes[i]
                b[1].append(i)
                break
        else:
            bins.append([sizes[i], [i]])
    return [
        GroupLayout([groups[i] for i in sorted(b)], [prompt_lens[i] for i in sorted(b)], ids)
        for _, b in bins
    ]


def tree_backward(model, ids, masks, groups, prompt_lens, weights, cap):
    """One step's gradient, tree-packed: every micro-batch's weighted loss, backward. ``weights``
    are the plan's per-rollout loss weights. Returns (micro-batches, rows forwarded)."""
    layouts = pack_groups(groups, prompt_lens, ids, cap)
    for layout in layouts:
        loss, _ = tree_loss(model, layout, targets_of(layout, ids, masks, weights))
        loss.backward()
    return len(layouts), sum(len(layout.ids) for layout in layouts)


def make_groups(num_groups, n, seed, vocab=61, prompt_len=(8, 64), completion_len=(2, 48)):
    """A GRPO batch: ``num_groups`` prompts (masked) with ``n`` completions each (trained).
    Returns (ids, masks, groups, prompt_lens) with rollouts group after group."""
    g = torch.Generator().manual_seed(seed)
    ids, masks, groups, prompt_lens = [], [], [], []
    for _ in range(num_groups):
        prompt_len_g = int(torch.randint(*prompt_len, (1,), generator=g))
        prompt = torch.randint(0, vocab, (prompt_len_g,), generator=g)
        group = []
        for _ in range(n):
            length = int(torch.randint(*completion_len, (1,), generator=g))
            completion = torch.randint(0, vocab, (length,), generator=g)
            group.append(len(ids))
            ids.append(torch.cat([prompt, completion]))
            mask = torch.ones(prompt_len_g + length, dtype=torch.bool)
            mask[:prompt_len_g] = False
            masks.append(mask)
        groups.append(group)
        prompt_lens.append(prompt_len_g)
    return ids, masks, groups, prompt_lens


def main():
    ids, masks, groups, prompt_lens = make_groups(4, 8, seed=0)
    counts = tiny_lm.loss_tokens(masks)
    weights = [1.0 / sum(counts)] * len(ids)  # token_mean over the whole batch
    layout = GroupLayout(groups, prompt_lens, ids)
    print(
        f"{len(ids)} rollouts, {sum(len(x) for x in ids)} tokens unshared, "
        f"{len(layout.ids)} forwarded with tree packing"
    )

    model = tiny_lm.TinyCausalLM(dtype=torch.float64)
    loss, per_target = tree_loss(model, layout, targets_of(layout, ids, masks, weights))
    loss.backward()
    tree_grad = tiny_lm.flat_grad(model)
    model.zero_grad()
    tiny_lm.padded_loss(model, ids, masks, "token_mean").backward()
    error = float((tree_grad - tiny_lm.flat_grad(model)).abs().max())
    print(f"float64 gradient, tree-packed vs padded per rollout: max |difference| = {error:.2e}")
    logprobs = tree_kernels.restore(
        -per_target.detach(), targets_of(layout, ids, masks, weights).index
    )
    mean = float(logprobs[0].mean())
    print(f"rollout 0: {len(logprobs[0])} log-probabilities restored, mean {mean:.3f}")

    model = tiny_lm.TinyCausalLM(dtype=torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    targets = targets_of(layout, ids, masks, weights)
    for step in range(5):
        optimizer.zero_grad()
        loss, _ = tree_loss(model, layout, targets)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {float(loss):.4f} (uniform: {math.log(61):.4f})")


if __name__ == "__main__":
    main()
