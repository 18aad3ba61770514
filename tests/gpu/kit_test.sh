#!/usr/bin/env bash
# gpu_kit_test (ctest): the GPU kit's CPU mode, so the kit cannot rot while no GPU runs it.
#
#   kit_test.sh BUILD_DIR SCRATCH_DIR
#
# Contract: assembles a kit in SCRATCH_DIR/kit from BUILD_DIR's binaries (this build's own CUDA
# architectures: no sm_90 compile), then checks, failing (exit 1) on the first that does not hold:
#  1. every kit binary resolves its libraries inside the kit's lib/ (assemble_kit.py verify);
#  2. without a GPU, run.sh prints exactly `no GPU found: GPU checks skipped`, exits 0 and writes
#     nothing;
#  3. forced to run every step on this CPU machine (PACKSCHED_GPU_KIT_FORCE=1; the Python module
#     built from the kernels-only CMake path for PYTHON, default /usr/bin/python3; no
#     compute-sanitizer, which would only wait for a device), run.sh exits 0, writes at most 8 files, its
#     gpu-results.json follows the schema (report.py --validate), the kit binaries load and the
#     module builds (those two checks pass even without a GPU).
# About 20-30 s on 2 cores (most of it the module's compile). Skips (exit 0, with a message) on a
# machine that has a GPU: there, run the kit itself.
set -euo pipefail
build=$(cd "${1:?usage: kit_test.sh BUILD_DIR SCRATCH_DIR}" && pwd)
scratch=${2:?usage: kit_test.sh BUILD_DIR SCRATCH_DIR}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-/usr/bin/python3}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "kit_test: a GPU is present; run the kit itself (tests/gpu/README.md)"
  exit 0
fi
rm -rf "$scratch"
mkdir -p "$scratch"
kit=$scratch/kit
"$python" "$here/assemble_kit.py" assemble --build "$build" --kit "$kit"
"$python" "$here/assemble_kit.py" verify --kit "$kit"
echo "kit_test: 1. the kit's binaries load from its lib/"

skip_out=$scratch/skip-out
printed=$(cd "$scratch" && OUT=$skip_out "$kit/run.sh")
if [ "$printed" != "no GPU found: GPU checks skipped" ] || [ -e "$skip_out" ]; then
  echo "kit_test: run.sh without a GPU printed '$printed' (or wrote $skip_out)" >&2
  exit 1
fi
echo "kit_test: 2. without a GPU, run.sh prints the skip line and writes nothing"

out=$scratch/forced-out
PACKSCHED_GPU_KIT_FORCE=1 PACKSCHED_GPU_KIT_BUDGET_S=240 PACKSCHED_GPU_KIT_SANITIZER=none \
  PYTHON=$python OUT=$out TMPDIR=$scratch "$kit/run.sh" >"$scratch/forced.log" 2>&1 || {
  echo "kit_test: the forced run.sh failed:" >&2
  tail -30 "$scratch/forced.log" >&2
  exit 1
}
files=$(find "$out" -type f | wc -l)
if [ "$files" -gt 8 ]; then
  echo "kit_test: run.sh wrote $files files into \$OUT (at most 8)" >&2
  exit 1
fi
"$python" "$here/report.py" --validate "$out/gpu-results.json"
"$python" - "$out/gpu-results.json" <<'PY'
import json
import sys

checks = {c["id"]: c for c in json.load(open(sys.argv[1]))["checks"]}
for name in ("kit_loads", "python_module"):
    if checks[name]["status"] != "pass":
        sys.exit(f"kit_test: {name}: {checks[name]['status']}: {checks[name]['reason']}")
PY
echo "kit_test: 3. forced on the CPU: $files files, gpu-results.json follows the schema," \
  "the binaries load and the module builds"
cat "$out/gpu-results.md"
