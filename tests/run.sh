#!/usr/bin/env bash
# The README's test command: installs dependencies (Debian's packages for the C++ build, the pinned
# PyPI stack into .venv: deploy/venv.sh), builds everything into build/ for the venv's interpreter
# and runs every test (C++ and the CMake-driven Python checks through ctest, the Python suite
# through pytest, all with the venv's python).
set -euo pipefail
cd "$(dirname "$0")/.."

./deploy/install-deps.sh
python="$(./deploy/venv.sh)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPACKSCHED_PYTHON="$python"
cmake --build build -j 2
ctest --test-dir build --output-on-failure -j 2
if compgen -G "tests/python/test_*.py" >/dev/null; then
  PYTHONPATH=build/python "$python" -m pytest -q tests/python
fi
echo "tests/run.sh: all tests passed"
