"""One process of the dynamic-CP gradient test (tests/python/test_dynamic_cp_gradient.py): rank
RANK of R ranks, one step planned by packsched.dynamic_cp, CP groups of mixed sizes per slot.

Every process plans the same step (the plan is deterministic), creates one gloo group per group
name, and in every slot runs its group's micro-batch as CP rank (its index in the group) of a
group of that size: its head-tail shard of the ids, positions and shifted labels, attention
against the group's all-gathered keys and values, the weighted cross entropy of its rows
(tiny_lm.cp_packed_backward). The gradients are summed over all processes; rank 0 saves them
with the sizes the plan used. CONTROL "controls" runs token_mean twice more instead, skipping
the first non-empty micro-batch of slot 0 ("drop") and running it twice ("duplicate"): the
gradient must then differ.

Usage: dynamic_cp_rank.py RANK RANKS SIZES DIST_PORT OUT_PREFIX CONTROL
"""

import pathlib
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parents[3] / "client" / "python" / "examples")
)

import tiny_lm  # noqa: E402
from packsched.dynamic_cp import dynamic_cp  # noqa: E402

MODES = ["token_mean", "sample_mean", "seq_sum", "sum", "sum_norm"]
SUM_NORM = 7.0
CAP = 24  # rows a rank: 96 tokens need 4 ranks, 49-72 need 3 (or 4), 25-48 need 2
COST = (1, 0, 40, 0, 0, 0)  # communication dear: short sequences stay on one rank
SEED = 5
NUM_SEQUENCES = 18


def batch():
    return tiny_lm.make_batch(NUM_SEQUENCES, seed=SEED)


def main():
    rank, ranks, sizes = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    port, out, control = int(sys.argv[4]), sys.argv[5], sys.argv[6]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    ids, masks = batch()
    lengths = [len(x) for x in ids]
    grads = {}
    groups = {}
    # (key, loss mode, fault): every mode as planned, or token_mean with one group's
    # micro-batch dropped and with it run twice.
    runs = [(m, m, "none") for m in MODES] if control == "none" else []
    if control == "controls":
        runs = [("drop", MODES[0], "drop"), ("duplicate", MODES[0], "duplicate")]
    for key, mode, fault in runs:
        plan = dynamic_cp(
            lengths,
            ranks,
            CAP,
            sizes=sizes,
            cost=COST,
            loss_tokens=tiny_lm.loss_tokens(masks),
            loss_mode=mode,
            sum_norm_constant=SUM_NORM,
        )
        for name, (first, size) in enumerate(plan.group_names):
            if (first, size) not in groups:  # every process creates them in the same order
                groups[(first, size)] = dist.new_group(list(range(first, first + size)))
        model = tiny_lm.TinyCausalLM(dtype=torch.float64)
        dropped = False
        for mb in plan.for_rank(rank):
            if not mb.sequences:
                continue
            times = 1
            if mb.slot == 0 and not dropped and fault != "none":
                dropped = True  # the first non-empty group of slot 0 (every member alike)
                first_group = next(g for g in plan.slots[0]["groups"] if g["sequences"])
                if first_group["first_rank"] == mb.group[0]:
                    times = 0 if fault == "drop" else 2
            real = [0]
            for s in mb.sequences:
                real.append(real[-1] + lengths[s])
            shim = SimpleNamespace(
                micro_batches=[list(mb.sequences)],
                metadata=[
                    SimpleNamespace(
                        empty=False,
                        cu_seqlens=real,
                        cu_seqlens_aligned=list(mb.cu_seqlens),
                        tokens=real[-1],
                    )
                ],
                loss_weights=plan.loss_weights,
            )
            for _ in range(times):
                tiny_lm.cp_packed_backward(
                    model, shim, ids, masks, mb.cp, mb.cp_rank, groups[mb.group[0], mb.cp]
                )
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        grads[key] = tiny_lm.flat_grad(model)
        grads[f"{key}/sizes"] = torch.tensor(sorted(set(plan.cp_of_sequence)))
    if rank == 0:
        torch.save(grads, f"{out}.grads.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    from rank_exit import run

    run(main)
