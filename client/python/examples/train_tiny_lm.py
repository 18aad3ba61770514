#!/usr/bin/env python3
"""Example trainer: W data-parallel ranks, one packsched sidecar each, training a tiny causal LM
on CPU with packed micro-batches — beside a padded baseline run on the same batches.

Each step, every rank plans its share of the batch over its sidecar (the sidecars agree the
micro-batch count and the global loss counts), packs each micro-batch with packsched's kernels
(positions, shifted labels, varlen attention, packed cross entropy), accumulates the weighted
gradients, all-reduces them over torch.distributed (gloo) and steps the optimizer. The baseline
runs the same batch as fixed-size micro-batches padded to their longest sequence. Rank 0 prints
step time, tokens/s and the padding each way.

With --context_parallel CP > 1 every data-parallel rank is a group of CP processes: the group's
first plans over the sidecar (the plan is made with context_parallel = CP, so align_to = 2 * CP)
and broadcasts it; each process runs its head-tail shard of every micro-batch
(tiny_lm.cp_packed_backward: keys and values all-gathered over the group), and the gradients are
all-reduced over all W * CP processes. (The padded baseline then runs on every process of a group,
each weighted 1 / CP through the all-reduced token count.)

With --tree the batch is GRPO-shaped (prompts with --group_size completions each) and each step
runs twice on the same batch: flat packing (every rollout its own sequence, the prompt forwarded
once per rollout) and tree packing (examples/tree_packing.py: each group one tree, its prompt
forwarded once; tree attention and the multi-target cross entropy), both with the plan's loss
weights. Rank 0 prints both step times and the tokens each forwards.

    PYTHONPATH=build/python .venv/bin/python client/python/examples/train_tiny_lm.py \\
        [--world_size 2] [--context_parallel 1] [--steps 3] [--sequences 48] [--max_len 512] \\
        [--max_token_len 4096] [--tree [--group_size 8]]

Needs build/bin/packsched-server (the README's build).
"""

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "python"))

import tiny_lm  # noqa: E402
import tree_packing  # noqa: E402
from packsched.client import SchedulerClient  # noqa: E402


def model_of(args):
    return tiny_lm.TinyCausalLM(
        vocab=args.vocab,
        dim=128,
        heads=8,
        kv_heads=2,
        head_dim=16,
        max_len=args.max_len,
        dtype=torch.float32,
    )


def padded_step(model, ids, masks, micro_batch_size, world_size):
    """The baseline: fixed-size micro-batches, each padded to its longest sequence, token_mean
    over the global batch (its token count all-reduced like the packed run's)."""
    count = torch.tensor([sum(tiny_lm.loss_tokens(masks))], dtype=torch.float64)
    dist.all_reduce(count)
    padded = 0
    for start in range(0, len(ids), micro_batch_size):
        chunk_ids, chunk_masks = (
            ids[start : start + micro_batch_size],
            masks[start : start + micro_batch_size],
        )
        seqlen = max(len(x) for x in chunk_ids)
        tokens = torch.zeros(len(chunk_ids), seqlen, dtype=torch.int64)
        real = torch.zeros_like(tokens, dtype=torch.bool)
        trained = torch.zeros_like(real)
        for b, (x, m) in enumerate(zip(chunk_ids, chunk_masks)):
            tokens[b, : len(x)], real[b, : len(x)], trained[b, : len(x)] = x, True, m
        logits = model.forward_padded(tokens, real)
        labels = torch.where(
            real[:, 1:] & trained[:, 1:],
            tokens[:, 1:],
            torch.full_like(tokens[:, 1:], tiny_lm.IGNORE),
        )
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=tiny_lm.IGNORE,
            reduction="sum",
        )
        (loss / float(count)).backward()
        padded += tokens.numel()
    return padded


def all_reduce_grads(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def tree_main(args):
    """--tree: flat packing against tree packing on the same GRPO batches (see the docstring)."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.dist_port}",
        rank=args.rank,
        world_size=args.world_size,
    )
    flat_model, tree_model = model_of(args), model_of(args)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (flat_model, tree_model)]
    client = SchedulerClient(args.sidecar)
    if args.rank == 0:
        print(
            f"{'step':>4} {'k flat':>6} {'k tree':>6} {'flat s':>7} {'tree s':>7} {'speed-up':>8}"
            f" {'tokens flat':>11} {'tokens tree':>11}"
        )
    n = args.group_size
    for step in range(args.steps):
        ids, masks, groups, prompt_lens = tree_packing.make_groups(
            args.sequences // n,
            n,
            seed=1000 * step + args.rank,
            vocab=args.vocab,
            prompt_len=(args.max_len // 8, args.max_len // 2),
            completion_len=(args.max_len // 32, args.max_len // 4),
        )
        for model, opt in zip((flat_model, tree_model), optimizers):
            opt.zero_grad(set_to_none=False)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)

        dist.barrier()
        start = time.perf_counter()
        plan = client.plan(
            2 * step,
            [len(x) for x in ids],
            args.max_token_len,
            stream="flat",
            loss_tokens=tiny_lm.loss_tokens(masks),
            loss_mode="token_mean",
        )
        tiny_lm.packed_backward(flat_model, plan, ids, masks)
        all_reduce_grads(flat_model)
        optimizers[0].step()
        flat_s = time.perf_counter() - start

        dist.barrier()
        start = time.perf_counter()
        # The loss weights of the rollouts (the sidecar agrees the global counts); the trees are
        # packed in process (tree_packing.pack_groups).
        weights = client.plan(
            2 * step + 1,
            [len(x) for x in ids],
            args.max_token_len,
            stream="tree",
            loss_tokens=tiny_lm.loss_tokens(masks),
            loss_mode="token_mean",
        ).loss_weights
        k_tree, rows = tree_packing.tree_backward(
            tree_model, ids, masks, groups, prompt_lens, weights, args.max_token_len
        )
        all_reduce_grads(tree_model)
        optimizers[1].step()
        tree_s = time.perf_counter() - start

        totals = torch.tensor(
            [sum(len(x) for x in ids), rows, flat_s, tree_s, plan.num_micro_batches, k_tree],
            dtype=torch.float64,
        )
        dist.all_reduce(totals[:2])
        dist.all_reduce(totals[2:], op=dist.ReduceOp.MAX)
        if args.rank == 0:
            flat_tokens, tree_tokens, flat_max, tree_max, k_flat, k_max = totals.tolist()
            print(
                f"{step:>4} {k_flat:>6.0f} {k_max:>6.0f} {flat_max:>7.2f} {tree_max:>7.2f}"
                f" {flat_max / tree_max:>7.2f}x {flat_tokens:>11.0f} {tree_tokens:>11.0f}"
            )
    client.close()
    dist.destroy_process_group()


def rank_main(args):
    if args.tree:
        return tree_main(args)
    cp = args.context_parallel
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.dist_port}",
        rank=args.rank,
        world_size=args.world_size * cp,
    )
    dp, cp_rank = args.rank // cp, args.rank % cp
    cp_groups = [dist.new_group(list(range(d * cp, (d + 1) * cp))) for d in range(args.world_size)]
    packed_model, padded_model = model_of(args), model_of(args)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (packed_model, padded_model)]
    # One sidecar per DP rank, used by its CP group's first process; the default timeout outlasts
    # the sidecar's collective timeout.
    client = SchedulerClient(args.sidecar) if cp_rank == 0 else None
    if args.rank == 0:
        print(
            f"{'step':>4} {'micro-batches':>13} {'packed s':>9} {'padded s':>9} {'speed-up':>8}"
            f" {'packed tok/s':>12} {'padded tok/s':>12} {'padding (padded run)':>21}"
        )
    for step in range(args.steps):
        ids, masks = tiny_lm.make_batch(
            args.sequences, seed=1000 * step + dp, vocab=args.vocab, max_len=args.max_len
        )
        real = sum(len(x) for x in ids)
        for opt in optimizers:
            opt.zero_grad(set_to_none=False)
        for p in list(packed_model.parameters()) + list(padded_model.parameters()):
            p.grad = torch.zeros_like(p)

        dist.barrier()
        start = time.perf_counter()
        plan = [None]
        if cp_rank == 0:
            plan[0] = client.plan(
                step,
                [len(x) for x in ids],
                args.max_token_len,
                stream="train",
                loss_tokens=tiny_lm.loss_tokens(masks),
                loss_mode="token_mean",
                **({"context_parallel": cp} if cp > 1 else {}),
            )
        if cp > 1:
            dist.broadcast_object_list(plan, src=dp * cp, group=cp_groups[dp])
            plan = plan[0]
            tiny_lm.cp_packed_backward(packed_model, plan, ids, masks, cp, cp_rank, cp_groups[dp])
        else:
            plan = plan[0]
            tiny_lm.packed_backward(packed_model, plan, ids, masks)
        all_reduce_grads(packed_model)
        optimizers[0].step()
        packed_s = time.perf_counter() - start

        dist.barrier()
        start = time.perf_counter()
        padded_tokens = padded_step(
            padded_model, ids, masks, args.padded_micro_batch_size, args.world_size
        )
        all_reduce_grads(padded_model)
        optimizers[1].step()
        padded_s = time.perf_counter() - start

        totals = torch.tensor([real, padded_tokens, packed_s, padded_s], dtype=torch.float64)
        dist.all_reduce(totals[:2])
        totals[:2] /= cp  # every process of a CP group counted its DP rank's batch
        dist.all_reduce(totals[2:], op=dist.ReduceOp.MAX)
        if args.rank == 0:
            real_all, padded_all, packed_max, padded_max = totals.tolist()
            print(
                f"{step:>4} {plan.num_micro_batches:>13} {packed_max:>9.2f} {padded_max:>9.2f}"
                f" {padded_max / packed_max:>7.2f}x {real_all / packed_max:>12.0f}"
                f" {real_all / padded_max:>12.0f} {100 * (1 - real_all / padded_all):>20.1f}%"
            )
    if client is not None:
        client.close()
    dist.destroy_process_group()


def launch(args):
    from sidecar import free_port, start_group

    with tempfile.TemporaryDirectory() as tmp:
        sidecars = start_group(tmp, args.world_size)
        try:
            port = free_port()
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--rank",
                        str(r),
                        "--sidecar",
                        sidecars[r // args.context_parallel].target,
                        "--dist_port",
                        str(port),
                    ]
                    + sys.argv[1:],
                    env=env,
                )
                for r in range(args.world_size * args.context_parallel)
            ]
            codes = [p.wait() for p in procs]
        finally:
            for s in sidecars:
                s.stop()
    return max(codes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument(
        "--context_parallel",
        type=int,
        default=1,
        help="processes per data-parallel rank, each running a head-tail shard",
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=48, help="per rank and step")
    parser.add_argument("--max_len", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--max_token_len", type=int, default=4096)
    parser.add_argument("--padded_micro_batch_size", type=int, default=8)
    parser.add_argument(
        "--tree",
        action="store_true",
        help="GRPO batches: flat packing against tree packing (each prompt forwarded once)",
    )
    parser.add_argument("--group_size", type=int, default=8, help="completions per prompt (--tree)")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sidecar", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dist_port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.rank is None:
        sys.exit(launch(args))
    rank_main(args)


if __name__ == "__main__":
    main()
