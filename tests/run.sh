#!/usr/bin/env bash
# The README's test command: installs dependencies, builds everything into build/ and runs every
# test (C++ through ctest, Python through pytest with Debian's /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/.."

./deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j 2
ctest --test-dir build --output-on-failure -j 2
if compgen -G "tests/python/test_*.py" >/dev/null; then
  PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
fi
echo "tests/run.sh: all tests passed"
