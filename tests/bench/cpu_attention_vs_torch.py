#!/usr/bin/env python3
"""packsched's CPU varlen attention against torch's scaled_dot_product_attention, in one run.

The shape of `attention_bench --benchmark_filter=Cpu` (its Hk = H case): 8 sequences of 1,024
tokens, H = 16, D = 128, causal, random normal inputs (seed fixed), in bfloat16 and float32.
packsched: packsched.kernels.varlen_attention on the packed q, k, v [8,192, 16, 128] with
cu_seqlens. torch: torch.nn.functional.scaled_dot_product_attention(is_causal=True) on the same
storage as one batch [8, 16, 1,024, 128] (a transposed view, no copy). Forward: under
torch.no_grad(). Backward: torch.autograd.grad of the output against q, k, v with a fixed
upstream gradient, after an untimed forward with grad; both through autograd, as a trainer runs
them.

Each repetition times, per dtype, the forward of both and then the backward of both, the order of
the two swapped every repetition (ABBA); the table gives the median and the range over the
repetitions, and packsched's rate over torch's (of the median times). FLOPs count the visible
(query, key) pairs as 2 * 2 * L^2 / 2 * H * D per sequence forward (Q K^T and P V), the backward
2.5x that (FlashAttention's convention). Threads: both at their defaults (torch:
torch.get_num_threads(); packsched's CPU kernel: the hardware's thread count, which
torch.set_num_threads does not change); the script prints both. It also prints the largest
difference between the two outputs and gradients (relative to torch's largest entry), as a check
that both computed the same.

    PYTHONPATH=build/python .venv/bin/python tests/bench/cpu_attention_vs_torch.py [--reps 5]
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from packsched.kernels import varlen_attention


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


class Case:
    """One dtype's inputs, shared by both implementations."""

    def __init__(self, dtype, seqs, length, heads, dim, seed):
        g = torch.Generator().manual_seed(seed)
        shape = (seqs * length, heads, dim)
        self.q, self.k, self.v, self.dout = (
            torch.randn(shape, generator=g, dtype=torch.float32).to(dtype) for _ in range(4)
        )
        self.seqs, self.length = seqs, length
        self.cu = torch.arange(0, seqs * length + 1, length, dtype=torch.int32)

    def batched(self, x):
        """[B * L, H, D] -> [B, H, L, D], a view of the same storage."""
        return x.view(self.seqs, self.length, *x.shape[1:]).transpose(1, 2)

    def packsched_forward(self, q, k, v):
        return varlen_attention(q, k, v, self.cu, self.cu, self.length, self.length, causal=True)

    def torch_forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, which):
        with torch.no_grad():
            if which == "packsched":
                return timed(lambda: self.packsched_forward(self.q, self.k, self.v))
            b = self.batched
            return timed(lambda: self.torch_forward(b(self.q), b(self.k), b(self.v)))

    def backward(self, which):
        if which == "packsched":
            leaves = [x.detach().requires_grad_() for x in (self.q, self.k, self.v)]
            out, dout = self.packsched_forward(*leaves), self.dout
        else:
            leaves = [self.batched(x).detach().requires_grad_() for x in (self.q, self.k, self.v)]
            out, dout = self.torch_forward(*leaves), self.batched(self.dout)
        return timed(lambda: torch.autograd.grad(out, leaves, dout))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--len", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    tokens = args.seqs * args.len
    fwd_flops = args.seqs * 2 * 2 * args.len**2 / 2 * args.heads * args.dim
    flops = {"forward": fwd_flops, "backward": 2.5 * fwd_flops}
    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"torch threads {torch.get_num_threads()}, packsched threads {os.cpu_count()} "
        f"(hardware); load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{args.seqs} x {args.len} tokens, H = {args.heads}, D = {args.dim}, causal; "
        f"{args.reps} repetitions"
    )

    cases = {name: Case(getattr(torch, name), **_shape(args)) for name in args.dtypes.split(",")}
    for name, case in cases.items():
        _check(name, case)

    times = {}  # (dtype, pass, impl) -> [seconds]
    for rep in range(args.reps):
        order = ("packsched", "torch") if rep % 2 == 0 else ("torch", "packsched")
        for name, case in cases.items():
            for pass_ in ("forward", "backward"):
                for which in order:
                    seconds, _ = getattr(case, pass_)(which)
                    times.setdefault((name, pass_, which), []).append(seconds)
        print(f"  repetition {rep + 1}: load average {os.getloadavg()[0]:.2f}", flush=True)

    print(
        f"\n{'dtype':<9} {'pass':<9} {'impl':<10} {'tokens/s median (range)':>26} "
        f"{'GFLOP/s median (range)':>26} {'packsched / torch':>18}"
    )
    for name in cases:
        for pass_ in ("forward", "backward"):
            ratio = statistics.median(times[(name, pass_, "torch")]) / statistics.median(
                times[(name, pass_, "packsched")]
            )
            for which in ("packsched", "torch"):
                t = times[(name, pass_, which)]
                med, fast, slow = statistics.median(t), min(t), max(t)
                rate = f"{tokens / med:,.0f} ({tokens / slow:,.0f}-{tokens / fast:,.0f})"
                gf = flops[pass_] / 1e9
                gflops = f"{gf / med:.1f} ({gf / slow:.1f}-{gf / fast:.1f})"
                shown = f"{ratio:.2f}x" if which == "packsched" else ""
                print(f"{name:<9} {pass_:<9} {which:<10} {rate:>26} {gflops:>26} {shown:>18}")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _shape(args):
    return dict(seqs=args.seqs, length=args.len, heads=args.heads, dim=args.dim, seed=args.seed)


def _check(name, case):
    """Largest difference between the two outputs and gradients (untimed), relative to the
    largest entry of torch's."""
    results = {}
    for which in ("packsched", "torch"):
        if which == "packsched":
            leaves = [x.detach().requires_grad_() for x in (case.q, case.k, case.v)]
            out = case.packsched_forward(*leaves)
            grads = torch.autograd.grad(out, leaves, case.dout)
        else:
            leaves = [case.batched(x).detach().requires_grad_() for x in (case.q, case.k, case.v)]
            out = case.torch_forward(*leaves)
            grads = torch.autograd.grad(out, leaves, case.batched(case.dout))
            out = out.transpose(1, 2).reshape(case.q.shape)
            grads = [g.transpose(1, 2).reshape(case.q.shape) for g in grads]
        results[which] = [x.float() for x in (out, *grads)]
    diffs = [
        ((a - b).abs().max() / b.abs().max()).item()
        for a, b in zip(results["packsched"], results["torch"])
    ]
    print(
        f"{name}: largest |packsched - torch| / largest |torch|: out {diffs[0]:.1e}, dq dk dv "
        + " ".join(f"{d:.1e}" for d in diffs[1:])
    )


if __name__ == "__main__":
    main()
