#!/usr/bin/env python3
"""Generates sequence lengths shaped like a realistic RL batch, deterministically.

Each length is prompt + response tokens: prompt lognormal (median 600, sigma 0.6) clamped to
[200, 2,000], response lognormal (median 1,500, sigma 1.0) clamped to [50, 16,000] -- the mix
tests/testing/lengths.h (RealisticRlLengths) documents. The same --n and --seed give the same
lengths on every machine (Python's Mersenne Twister); they are not the C++ generator's values.

    gen_lengths.py --n 1024 --seed 7                 one integer per line
    gen_lengths.py --n 4096 --seed 1 --format json   one JSON array
"""
import argparse
import json
import math
import random
import sys


def realistic_rl_lengths(n, seed):
    """n lengths of the realistic RL mix for `seed`."""
    rng = random.Random(seed)
    lengths = []
    for _ in range(n):
        prompt = min(max(rng.lognormvariate(math.log(600.0), 0.6), 200.0), 2000.0)
        response = min(max(rng.lognormvariate(math.log(1500.0), 1.0), 50.0), 16000.0)
        lengths.append(int(prompt) + int(response))
    return lengths


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, required=True, help="number of sequences")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--format",
        choices=("lines", "json"),
        default="lines",
        help="one integer per line (default) or one JSON array",
    )
    args = parser.parse_args()
    if args.n < 0:
        parser.error("--n must be >= 0")
    lengths = realistic_rl_lengths(args.n, args.seed)
    if args.format == "json":
        sys.stdout.write(json.dumps(lengths) + "\n")
    else:
        sys.stdout.write("".join(f"{length}\n" for length in lengths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
