"""One process of the context-parallel gradient test (tests/python/test_cp_gradient.py): data-
parallel rank dp = rank // cp, context-parallel rank c = rank % cp.

Every process plans its DP rank's share with the in-process planner (the k agreed over the DP
ranks and the loss weights from the global counts, as the sidecar would give them), with
context_parallel = cp. Each micro-batch is packed aligned (align_to = 2 * cp), each CP rank keeps
its head-tail shard of the ids, positions and shifted labels, all-gathers the keys and values of
its CP group (gloo), runs cp_attention and the weighted cp_cross_entropy of its rows, and
backwards. The gradients are then summed over all processes (CP ranks hold partial sums, DP ranks
their shares); rank 0 saves them.

Usage: cp_gradient_rank.py RANK CP DP DIST_PORT OUT_PREFIX
"""

import pathlib
import sys

import torch
import torch.distributed as dist

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parents[3] / "client" / "python" / "examples")
)

import tiny_lm  # noqa: E402
from packsched import planner  # noqa: E402

MODES = ["token_mean", "sample_mean"]
CAP = 160


def share(num_sequences, dp, dp_size):
    return list(range(dp, num_sequences, dp_size))


def main():
    rank, cp, dp_size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    port, out = int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    world = cp * dp_size
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    groups = [dist.new_group(list(range(d * cp, (d + 1) * cp))) for d in range(dp_size)]
    dp, c = rank // cp, rank % cp
    ids, masks = tiny_lm.make_batch(8 * dp_size + 1, seed=cp)
    shares = [share(len(ids), d, dp_size) for d in range(dp_size)]
    grads = {}
    for mode in MODES:
        options = dict(loss_mode=mode, dp_reduction="sum", context_parallel=cp)
        # What the sidecar's round agrees: k over the DP ranks and the global loss counts.
        bounds = [
            planner.local_bound(
                [len(ids[i]) for i in s],
                CAP,
                loss_tokens=tiny_lm.loss_tokens([masks[i] for i in s]),
                **options,
            )
            for s in shares
        ]
        k = max(b.k for b in bounds)
        counts = tuple(sum(b.loss_counts[j] for b in bounds) for j in range(2))
        mine = shares[dp]
        my_ids, my_masks = [ids[i] for i in mine], [masks[i] for i in mine]
        plan = planner.partition(
            [len(x) for x in my_ids],
            k,
            CAP,
            global_counts=counts,
            world_size=dp_size,
            loss_tokens=tiny_lm.loss_tokens(my_masks),
            **options,
        )
        model = tiny_lm.TinyCausalLM(dtype=torch.float64)
        tiny_lm.cp_packed_backward(model, plan, my_ids, my_masks, cp, c, groups[dp])
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        grads[mode] = tiny_lm.flat_grad(model)
        grads[f"{mode}/num_micro_batches"] = torch.tensor(plan.num_micro_batches)
    if rank == 0:
        torch.save(grads, f"{out}.grads.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    from rank_exit import run

    run(main)
