#!/usr/bin/env bash
# The README's main job: installs dependencies (Debian's packages, the pinned PyPI stack into
# .venv), builds what the demo needs into build-demo/ (the
# sidecar and the Python package; no tests, benchmarks or CUDA kernels) and runs a local rank
# group — W packsched-server sidecars on loopback (default 4, Gloo, CPU only; rank 0 starts last)
# and a trainer simulation with one client process per rank planning realistic RL batches (a
# different size per rank) on two streams. Prints a per-round table (agreed k, local k per rank,
# micro-batch tokens, padding saved, latency), the sidecars' own phases beside the end-to-end
# latency, and a closing comparison with the plain-Python Karmarkar-Karp on the same batches;
# stops every sidecar and exits 0. `./tests/run.sh` builds everything into build/.
#
#   deploy/demo.sh [--world_size 8] [--rounds 5] [--n 2048] [--max_token_len 16384]
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout: a clone elsewhere reuses what this one compiled.
export CCACHE_BASEDIR="$PWD"

./deploy/install-deps.sh
python="$(./deploy/venv.sh)"
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DPACKSCHED_WITH_CUDA=OFF \
  -DPACKSCHED_PYTHON="$python" -DPACKSCHED_WITH_TESTS=OFF -DPACKSCHED_WITH_BENCHMARKS=OFF
cmake --build build-demo -j 2 --target packsched_server packsched_py_planner packsched_py_kernels \
  packsched_py_proto
PACKSCHED_PYTHON_DIR="$PWD/build-demo/python" "$python" deploy/demo_cluster.py \
  --server build-demo/bin/packsched-server "$@"
