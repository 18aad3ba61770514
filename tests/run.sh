#!/usr/bin/env bash
# The README's test command: installs dependencies (Debian's packages for the C++ build, the pinned
# PyPI stack into .venv: deploy/venv.sh), builds everything into build/ for the venv's interpreter
# and runs every test (C++ and the CMake-driven Python checks through ctest, the Python suite
# through pytest, all with the venv's python; then the kernel and planner tests again under the
# oldest supported torch).
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout: a clone elsewhere reuses what this one compiled.
export CCACHE_BASEDIR="$PWD"

./deploy/install-deps.sh
python="$(./deploy/venv.sh)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPACKSCHED_PYTHON="$python"
cmake --build build -j 2
ctest --test-dir build --output-on-failure -j 2
PYTHONPATH=build/python "$python" -m pytest -q tests/python
# The oldest supported stack (torch 2.4 with numpy 1.x, requirements/oldest.lock): the kernels,
# their torch ops (torch.compile included) and the planner, with the same extension modules.
oldest="$(./deploy/venv.sh --lock requirements/oldest.lock)"
PYTHONPATH=build/python "$oldest" -m pytest -q tests/python/test_kernels_*.py \
  tests/python/test_torch_ops.py tests/python/test_tree_kernels.py tests/python/test_planner.py \
  tests/python/test_tree.py
echo "tests/run.sh: all tests passed"
