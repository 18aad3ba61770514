#!/usr/bin/env python3
"""What choosing the attention backend per call costs (packsched._attention_backends): a small
varlen and tree attention call with torch tensors on the CPU: the choice alone
(packsched._attention_dispatch._choose: describe the call, look the table up, check the log set)
beside packsched's op that then runs (the CPU's choice; the baseline, same process), in
interleaved rounds.

    PYTHONPATH=build/python .venv/bin/python tests/bench/attention_dispatch_bench.py [--calls N]

Prints the median microseconds per call of each over the rounds, and the choice's share.
"""

import argparse
import statistics
import time

import torch

from packsched import _attention_dispatch, _torch_ops


def per_call_us(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    q = torch.randn(64, 4, 16)
    k = torch.randn(64, 2, 16)
    cu = torch.tensor([0, 20, 64], dtype=torch.int32)
    host = [0, 20, 64]
    ends = torch.tensor([64] * 10 + [40] * 30 + [64] * 24, dtype=torch.int32)
    varlen_layout = (cu, cu, 44, 44, None, True, (-1, -1), 0.0, None, None, host, host, None, None)
    tree_params = dict(
        cu_seqlens=torch.tensor([0, 64], dtype=torch.int32),
        max_seqlen=64,
        subtree_end=ends,
        positions=None,
        softmax_scale=None,
        window_left=-1,
        softcap=0.0,
        seqused=None,
        cu_seqlens_host=[0, 64],
        total=None,
    )
    cases = {
        "varlen_attention": (
            lambda: _attention_dispatch._choose(
                lambda: _attention_dispatch.describe_varlen(q, k, varlen_layout, False), None
            ),
            lambda: _torch_ops.varlen_attention(q, k, k, varlen_layout, grad=True),
        ),
        "tree_attention": (
            lambda: _attention_dispatch._choose(
                lambda: _attention_dispatch.describe_tree(q, k, k, tree_params, False), None
            ),
            lambda: _torch_ops.tree_attention(q, k, k, tree_params),
        ),
    }
    with torch.no_grad():
        for name, (choice, direct) in cases.items():
            choice(), direct()  # warm-up (the table read, op registration)
            chosen, base = [], []
            for _ in range(args.rounds):
                chosen.append(per_call_us(choice, args.calls))
                base.append(per_call_us(direct, args.calls))
            a, b = statistics.median(chosen), statistics.median(base)
            print(
                f"{name}: the choice {a:.1f} us/call, packsched's op (baseline) {b:.1f} us/call: "
                f"{100 * a / b:.1f}% of it"
            )


if __name__ == "__main__":
    main()
