#!/usr/bin/env bash
# The README's main job: installs dependencies, builds everything into build/ and runs a local
# rank group — W packsched-server sidecars on loopback (default 4, Gloo, CPU only; rank 0 starts
# last) and a trainer simulation with one Python client per rank planning realistic RL batches
# (a different size per rank) on two streams. Prints a per-round table (agreed k, local k per
# rank, micro-batch tokens, padding saved, latency) and a closing comparison with the
# plain-Python Karmarkar-Karp on the same batches; stops every sidecar and exits 0.
#
#   deploy/demo.sh [--world_size 8] [--rounds 5] [--n 2048] [--max_token_len 16384]
set -euo pipefail
cd "$(dirname "$0")/.."

./deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j 2
/usr/bin/python3 deploy/demo_cluster.py "$@"
