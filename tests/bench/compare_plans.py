#!/usr/bin/env python3
"""Compares two `packsched` CLIs' plans byte for byte over many inputs and options.

A planner change meant to be behaviour-preserving (a speed-up) must give every plan, error and
exit status exactly as before. Build the CLI at the branch point into another directory (or copy
build/bin/packsched before the first change), then:

    tests/bench/compare_plans.py --old /tmp/base/packsched --new build/bin/packsched

Inputs: tests/bench/gen_lengths.py realistic mixes, n in {1, 7, 64, 1024, 4096} (a few seeds),
caps 4,096 / 16,384 / 65,536, kk and lpt, crossed with option variants (cap mode, attention
cost, max_seqs_per_micro_batch, align_to, divisible_by, overlong isolate/drop, order,
min_micro_batches, fixed --num_parts, equal_size); the packers ffd, bfd and sequential with a
few variants each. Each case runs both CLIs with --format=json
and compares stdout, stderr and the exit status. Prints the count compared and every mismatch;
exits 1 on any mismatch. The one field that differs between runs of the same binary, the JSON's
"timing" object (wall time), is removed before comparing. Not part of the test command (it needs
two builds).
"""
import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "deploy"))
from gen_lengths import realistic_rl_lengths  # noqa: E402

SIZES = (1, 7, 64, 1024, 4096)
CAPS = (4096, 16384, 65536)
ALGORITHMS = ("kk", "lpt")

# Option variants crossed with every (n, cap, algorithm). Each is a list of extra flags.
VARIANTS = (
    ["--overlong=isolate"],
    ["--overlong=drop"],
    ["--overlong=isolate", "--cap_mode=padded"],
    ["--overlong=drop", "--cap_mode=padded", "--order=index"],
    ["--overlong=isolate", "--cost=attention"],
    ["--overlong=isolate", "--cost=attention", "--cap_mode=padded", "--order=interleave"],
    ["--overlong=isolate", "--max_seqs_per_micro_batch=4"],
    ["--overlong=drop", "--max_seqs_per_micro_batch=3", "--cost=attention"],
    ["--overlong=isolate", "--align_to=128", "--align_total_to=256"],
    ["--overlong=isolate", "--align_to=8", "--cap_mode=padded", "--cost=attention"],
    ["--overlong=isolate", "--divisible_by=4"],
    ["--overlong=drop", "--divisible_by=3", "--min_micro_batches=5"],
    ["--overlong=reject"],
    ["--overlong=isolate", "--cost=attention", "--attention_cost=1,0"],
)

# Dataset packing (PackDataset): the packers over every (n, cap).
PACKERS = ("ffd", "bfd", "sequential")
PACKER_VARIANTS = (
    ["--overlong=isolate"],
    ["--overlong=drop", "--cap_mode=padded", "--order=index"],
    ["--overlong=isolate", "--cost=attention", "--align_to=64", "--order=interleave"],
    ["--overlong=drop", "--max_seqs_per_micro_batch=5"],
)

# Fixed-k cases: (num_parts as a multiple of the n-dependent scale, extra flags).
FIXED_K = (
    (1, ["--overlong=isolate"]),
    (4, ["--overlong=isolate"]),
    (32, []),  # no cap
    (64, ["--cost=attention"]),  # no cap
    (8, ["--equal_size"]),  # no cap, n / k each when it divides
)


def cases(seeds):
    for n, seed in itertools.product(SIZES, seeds):
        lengths = realistic_rl_lengths(n, seed)
        for cap, algorithm, variant in itertools.product(CAPS, ALGORITHMS, VARIANTS):
            yield lengths, [f"--algorithm={algorithm}", f"--max_token_len={cap}"] + variant
        for cap, algorithm, variant in itertools.product(CAPS, PACKERS, PACKER_VARIANTS):
            yield lengths, [f"--algorithm={algorithm}", f"--max_token_len={cap}"] + variant
        for algorithm, (k, extra) in itertools.product(ALGORITHMS, FIXED_K):
            flags = [f"--algorithm={algorithm}", f"--num_parts={k}"] + extra
            if "--overlong=isolate" in extra:
                flags.append("--max_token_len=16384")
            yield lengths, flags


TIMING = re.compile(rb',"timing":\{[^{}]*\}')


def run(binary, lengths_file, flags):
    proc = subprocess.run(
        [binary, "plan", f"--lengths={lengths_file}", "--format=json"] + flags,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        check=False,
    )
    return proc.returncode, TIMING.sub(b"", proc.stdout), proc.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the reference packsched binary")
    parser.add_argument("--new", required=True, help="the packsched binary under test")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per size (default 2)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel cases (default 2)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        work = []
        for lengths, flags in cases(range(1, args.seeds + 1)):
            key = tuple(lengths)
            if key not in files:
                files[key] = os.path.join(tmp, f"lengths{len(files)}.txt")
                with open(files[key], "w") as f:
                    f.write("".join(f"{x}\n" for x in lengths))
            work.append((files[key], len(lengths), flags))

        def compare(item):
            path, n, flags = item
            old, new = run(args.old, path, flags), run(args.new, path, flags)
            return item, old, new

        compared = identical = errors = 0
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for (path, n, flags), old, new in pool.map(compare, work):
                compared += 1
                if old == new:
                    identical += 1
                    errors += old[0] != 0
                elif compared - identical <= 20:
                    print(
                        f"MISMATCH n={n} {os.path.basename(path)} {' '.join(flags)}: "
                        f"exit {old[0]} vs {new[0]}",
                        file=sys.stderr,
                    )
    print(
        f"compared {compared} plans: {identical} identical "
        f"({errors} of them identical errors), {compared - identical} different"
    )
    return 0 if identical == compared else 1


if __name__ == "__main__":
    sys.exit(main())
