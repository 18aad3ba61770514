"""One data-parallel rank of the end-to-end gradient test
(tests/python/test_gradient_equivalence.py).

Plans its share of the global batch through its own sidecar for every (dtype, loss mode,
dp_reduction), runs the micro-batches packed (packsched kernels), all-reduces the gradients over
torch.distributed (gloo) as a data-parallel trainer does, and on rank 0 saves the reduced
gradients; every rank saves what its plans looked like.

Usage: gradient_rank.py RANK WORLD_SIZE SIDECAR DIST_PORT OUT_PREFIX
"""

import json
import pathlib
import sys

import torch
import torch.distributed as dist

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parents[3] / "client" / "python" / "examples")
)

import tiny_lm  # noqa: E402
from packsched.client import SchedulerClient  # noqa: E402

MODES = ["token_mean", "sample_mean", "seq_sum", "sum", "sum_norm"]
SUM_NORM = 64.0
CAP = 160  # tokens per micro-batch: several micro-batches per rank (sequences are <= 96 tokens)


def share(world_size, rank, num_sequences):
    """Rank 0 gets one sequence (so it has empty micro-batches); the others split the rest."""
    if rank == 0:
        return [0]
    rest = list(range(1, num_sequences))
    return rest[rank - 1 :: world_size - 1]


def configs():
    for dtype in ("float64", "float32"):
        for mode in MODES:
            for reduction in ("sum", "mean"):
                yield dtype, mode, reduction, False
    yield "float64", "token_mean", "sum", True  # the negative control


def main():
    rank, world_size = int(sys.argv[1]), int(sys.argv[2])
    sidecar, port, out = sys.argv[3], int(sys.argv[4]), sys.argv[5]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    ids, masks = tiny_lm.make_batch(8 * world_size + 1, seed=world_size)
    mine = share(world_size, rank, len(ids))
    my_ids, my_masks = [ids[i] for i in mine], [masks[i] for i in mine]
    grads, info = {}, []
    with SchedulerClient(sidecar, timeout=60) as client:
        for round_, (dtype, mode, reduction, cross) in enumerate(configs()):
            plan = client.plan(
                round_,
                [len(x) for x in my_ids],
                CAP,
                stream="gradient",
                loss_tokens=tiny_lm.loss_tokens(my_masks),
                loss_mode=mode,
                dp_reduction=reduction,
                sum_norm_constant=SUM_NORM,
            )
            model = tiny_lm.TinyCausalLM(dtype=getattr(torch, dtype))
            tiny_lm.packed_backward(model, plan, my_ids, my_masks, cross_boundary_labels=cross)
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                if reduction == "mean":
                    p.grad /= world_size
            key = f"{dtype}/{mode}/{reduction}" + ("/cross_boundary" if cross else "")
            grads[key] = tiny_lm.flat_grad(model)
            info.append(
                {
                    "key": key,
                    "num_micro_batches": plan.num_micro_batches,
                    "empty": sum(plan.empty),
                    "max_tokens": max(m.tokens for m in plan.metadata),
                }
            )
    if rank == 0:
        torch.save(grads, f"{out}.grads.pt")
    pathlib.Path(f"{out}.rank{rank}.json").write_text(json.dumps(info))
    dist.destroy_process_group()


if __name__ == "__main__":
    from rank_exit import run

    run(main)
