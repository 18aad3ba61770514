#!/usr/bin/env bash
# Builds packsched._kernels for one Python from the GPU kit's kernels-only CMake path
# (KIT/module/CMakeLists.txt; tests/gpu/README.md).
#
#   build_module.sh --kit KIT --build DIR [--python PY] [--configure-only] [--jobs N]
#
# Contract: configures DIR from KIT/module with PY (default: python3) and its pybind11, then
# builds; on success DIR/packsched/ is an importable package (kernels.py and its modules, a
# kernels-only __init__.py and _kernels.<abi>.so): `PYTHONPATH=DIR PY -c 'import packsched.kernels'`, and the
# last line printed is `module: DIR/packsched`. --configure-only stops after the configure step.
# Needs CMake, a C++ compiler, the Python headers, pybind11 and (for a CUDA kit) the CUDA
# runtime; nothing else. Exit status: 0 on success, 1 on a failed step, 2 on bad arguments.
set -euo pipefail

kit="" build="" python="python3" configure_only=0 jobs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kit) kit=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --configure-only) configure_only=1; shift ;;
    *) echo "build_module.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$kit" ] || [ -z "$build" ]; then
  echo "usage: build_module.sh --kit KIT --build DIR [--python PY] [--configure-only]" >&2
  exit 2
fi
python=$(command -v "$python") || { echo "build_module.sh: no Python at $python" >&2; exit 1; }

args=(-S "$kit/module" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$python")
if command -v ninja >/dev/null 2>&1; then args+=(-G Ninja); fi
# pip's pybind11 knows its CMake folder; Debian's pybind11-dev is found by CMake itself.
if pybind11_dir=$("$python" -m pybind11 --cmakedir 2>/dev/null); then
  args+=(-Dpybind11_DIR="$pybind11_dir")
fi
# Without a CUDA toolkit on the machine, the CUDA runtime of Python's nvidia wheels serves.
if ! command -v nvcc >/dev/null 2>&1 && [ ! -e /usr/local/cuda/bin/nvcc ]; then
  cudart=$("$python" - <<'EOF' 2>/dev/null || true
import glob, os, site, sys
roots = [p for p in site.getsitepackages() + sys.path if p and os.path.isdir(p)]
hits = [h for r in roots for h in glob.glob(os.path.join(r, "nvidia", "**", "libcudart.so.1*"),
                                            recursive=True)]
print(sorted(hits)[0] if hits else "")
EOF
)
  if [ -n "$cudart" ]; then args+=(-DKIT_CUDART_LIBRARY="$cudart"); fi
fi

echo "build_module.sh: cmake ${args[*]}"
cmake "${args[@]}"
if [ "$configure_only" = 1 ]; then
  echo "build_module.sh: configured $build"
  exit 0
fi
cmake --build "$build" ${jobs:+-j "$jobs"}
PYTHONPATH="$build" "$python" -c \
  'import packsched.kernels as k; print("built_with_cuda:", k.built_with_cuda())'
echo "module: $build/packsched"
