#!/usr/bin/env bash
# The README's main job: installs dependencies, builds everything into build/ and plans a
# realistic RL batch (prompt 200-2,000 + response 50-16,000 tokens, lognormal) with the
# offline planner, printing the micro-batch table. The multi-rank sidecar demo replaces this
# once the rank-group issue lands.
set -euo pipefail
cd "$(dirname "$0")/.."

./deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j 2
/usr/bin/python3 tests/bench/gen_lengths.py --n 1024 --seed 7 > build/demo_lengths.txt
# About 1% of such sequences are longer than the cap: each gets a micro-batch of its own.
./build/bin/packsched plan --lengths=build/demo_lengths.txt --max_token_len=16384 \
  --overlong=isolate --format=table
