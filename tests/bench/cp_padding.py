#!/usr/bin/env python3
"""The padding that context parallelism's alignment costs: every sequence is padded to a multiple
of 2 * cp * tp (the head-tail layout), as a share of the real tokens, on two length mixes:

- rl: the realistic RL mix of gen_lengths.py (prompt + response, median about 2,100 tokens);
- long: a long-context mix, lognormal with median 32,768 tokens, sigma 0.8, clamped to
  [4,096, 131,072] (Python's Mersenne Twister, seed fixed).

    PYTHONPATH=build/python .venv/bin/python tests/bench/cp_padding.py [--n 4096] [--seed 1]
"""
import argparse
import math
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "deploy"))

from gen_lengths import realistic_rl_lengths  # noqa: E402


def long_context_lengths(n, seed):
    rng = random.Random(seed)
    return [
        int(min(max(rng.lognormvariate(math.log(32768.0), 0.8), 4096.0), 131072.0))
        for _ in range(n)
    ]


def overhead(lengths, align):
    padded = sum(-(-n // align) * align for n in lengths)
    return padded / sum(lengths) - 1.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    mixes = {
        "rl": realistic_rl_lengths(args.n, args.seed),
        "long": long_context_lengths(args.n, args.seed),
    }
    print(f"{'mix':>5} {'cp':>3} {'tp':>3} {'align':>6} {'padding':>9}")
    for name, lengths in mixes.items():
        for tp in (1, 8):
            for cp in (1, 2, 4, 8, 16):
                align = 2 * cp * tp if cp > 1 else tp
                print(
                    f"{name:>5} {cp:>3} {tp:>3} {align:>6} {100 * overhead(lengths, align):>8.3f}%"
                )


if __name__ == "__main__":
    main()
