"""Tree packing for verl-shaped batches (re-exported by packsched.compat.verl).

A verl batch: ``input_ids`` [B, S] (the prompt left-padded, then the response right-padded in
its last R columns), ``attention_mask`` [B, S] (nonzero = token), ``response_mask`` [B, R] (the
response tokens the loss counts) and ``uid`` (one group id per row: a GRPO prompt's rollouts
share it). ``tree_pack_batch`` turns the rows into a forest (packsched.tree.build_forest: a
trie per uid over exact token ids, so a group's shared prompt is forwarded once), plans it
(packsched.planner.plan_local) and gives one packed micro-batch per plan entry;
``tree_unpack`` and ``tree_log_probs`` bring per-row model outputs back to verl's [B, R]
response layout, as the trainer had them before packing.
"""

from dataclasses import dataclass

import numpy as np

from .. import planner
from ..tree import build_forest

__all__ = ["TreePacking", "tree_pack_batch", "tree_unpack", "tree_log_probs"]


@dataclass(frozen=True, eq=False)
class TreePacking:
    """How a batch was tree-packed. ``plan``: the TreePlan; ``forest``: its forest (rollout b =
    row b); ``rows[i]``: micro-batch i's rows of the batch (its rollouts, ascending);
    ``response_rows[i]``: [len(rows[i]), R] the packed row whose logits predict each response
    token (-1 past the response, or for a first token with no token before it);
    ``response_labels[i]``: [len(rows[i]), R] the response token ids; ``loss_weights``: per row
    (the plan's, with loss_tokens = response_mask's row sums); ``batch_size``, ``response_len``:
    B and R."""

    plan: object
    forest: object
    rows: list
    response_rows: list
    response_labels: list
    loss_weights: object
    batch_size: int
    response_len: int


def _numpy(x):
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def tree_pack_batch(batch, max_token_len, *, uid=None, **options):
    """Tree-packs a verl batch (a TensorDict or mapping with input_ids, attention_mask and
    response_mask; ``uid`` from ``uid=`` or ``batch["uid"]``, default one group per row).
    ``options``: packsched.planner.plan_local's keywords (the loss options included: the loss
    weights are per row, as for flat packing).

    Returns (micro_batches, packing): per micro-batch a dict of torch tensors on input_ids'
    device: ``input_ids`` [T] and ``position_ids`` [T] (a token's depth: its index in its row's
    real tokens), ``subtree_end`` [T] int32 (the tree mask: row i sees row j when j <= i <
    subtree_end[j]), ``cu_seqlens`` [P + 1] int32 (the pieces, the varlen kernels' sequences),
    ``max_seqlen`` (an int), and ``rows`` (the batch rows it holds); and a TreePacking for
    tree_unpack / tree_log_probs."""
    import torch

    input_ids = batch["input_ids"]
    mask = _numpy(batch["attention_mask"]) != 0
    ids = _numpy(input_ids)
    response_mask = _numpy(batch["response_mask"]) != 0
    b, s = ids.shape
    r_len = response_mask.shape[1]
    if uid is None:
        uid = batch["uid"] if "uid" in batch else np.arange(b)
    uid = list(_numpy(uid).tolist())
    if len(uid) != b:
        raise ValueError(f"uid has {len(uid)} entries for {b} rows")
    rollouts = [ids[i][mask[i]] for i in range(b)]
    prompt_len = mask[:, : s - r_len].sum(axis=1)
    forest = build_forest(rollouts, group_ids=uid)
    options.setdefault("loss_tokens", response_mask.sum(axis=1))
    plan = planner.plan_local(forest, max_token_len, **options)

    device = input_ids.device
    micro_batches, rows, response_rows, response_labels = [], [], [], []
    responses = ids[:, s - r_len :]
    for mb in plan.micro_batches:
        position, subtree_end = mb.rows(forest)
        held = mb.rollouts
        resp_rows = np.full((len(held), r_len), -1, dtype=np.int64)
        for i, row in enumerate(held.tolist()):
            packed = mb.rollout_rows(forest, i)
            # Response token j is rollout index prompt_len + j, predicted by the row before it.
            count = int(mask[row, s - r_len :].sum())
            at = prompt_len[row] + np.arange(count) - 1
            resp_rows[i, :count] = np.where(at >= 0, packed[np.maximum(at, 0)], -1)
        cu = np.asarray(mb.meta.cu_seqlens_aligned, dtype=np.int32)
        micro_batches.append(
            {
                "input_ids": torch.as_tensor(mb.input_ids(forest), device=device),
                "position_ids": torch.as_tensor(position.astype(np.int64), device=device),
                "subtree_end": torch.as_tensor(subtree_end, device=device),
                "cu_seqlens": torch.as_tensor(cu, device=device),
                "max_seqlen": int(np.diff(cu).max()) if len(cu) > 1 else 0,
                "rows": torch.as_tensor(held, device=device),
            }
        )
        rows.append(held)
        response_rows.append(resp_rows)
        response_labels.append(responses[held])
    packing = TreePacking(
        plan=plan,
        forest=forest,
        rows=rows,
        response_rows=response_rows,
        response_labels=response_labels,
        loss_weights=None if plan.loss_weights is None else np.asarray(plan.loss_weights),
        batch_size=b,
        response_len=r_len,
    )
    return micro_batches, packing


def tree_unpack(outputs, packing, fill=0):
    """Per-row outputs back in verl's response layout: ``outputs[i]`` is micro-batch i's
    [T, ...] tensor over its packed rows (logits, hidden states, values); the result is
    [B, R, ...] with entry (b, j) the output of the row that predicts response token j of row b
    (``fill`` where there is none). Differentiable with respect to ``outputs``."""
    import torch

    if len(outputs) != len(packing.rows):
        raise ValueError(
            f"tree_unpack: {len(outputs)} outputs for {len(packing.rows)} micro-batches"
        )
    first = outputs[0]
    out = torch.full(
        (packing.batch_size, packing.response_len) + tuple(first.shape[1:]),
        fill,
        dtype=first.dtype,
        device=first.device,
    )
    for values, held, resp_rows in zip(outputs, packing.rows, packing.response_rows):
        rows = torch.as_tensor(resp_rows, device=values.device)
        valid = rows >= 0
        gathered = values[rows.clamp(min=0)]
        gathered = torch.where(
            valid.reshape(valid.shape + (1,) * (gathered.dim() - 2)), gathered, fill
        )
        out = out.index_copy(0, torch.as_tensor(held, device=out.device), gathered)
    return out


def tree_log_probs(logits, packing, temperature=1.0):
    """verl's ``log_probs`` [B, R] from per-micro-batch logits [T, V]: for each response token
    the log-softmax of the row that predicts it, at the token (0 past the response). A branching
    row is read once per child: each row b gets its own label. Differentiable."""
    import torch

    out = torch.zeros(
        (packing.batch_size, packing.response_len), dtype=logits[0].dtype, device=logits[0].device
    )
    for values, held, resp_rows, labels in zip(
        logits, packing.rows, packing.response_rows, packing.response_labels
    ):
        rows = torch.as_tensor(resp_rows, device=values.device)
        valid = rows >= 0
        lp = torch.log_softmax(values[rows.clamp(min=0)].float() / temperature, dim=-1)
        picked = lp.gather(-1, torch.as_tensor(labels, device=values.device).unsqueeze(-1))
        picked = torch.where(valid, picked.squeeze(-1), 0.0).to(out.dtype)
        out = out.index_copy(0, torch.as_tensor(held, device=out.device), picked)
    return out
