#!/usr/bin/env bash
# The GPU check (tests/gpu/README.md): runs the prepared kit on a GPU machine.
#
#   KIT/run.sh                      results in $OUT (default ./gpu-out)
#
# Contract:
#  - Without a GPU (no nvidia-smi GPU and no /dev/nvidia<N>) it prints exactly
#    `no GPU found: GPU checks skipped`, writes nothing and exits 0.
#  - With one it runs every step below under its own time limit, cut to what is left of a total
#    budget (PACKSCHED_GPU_KIT_BUDGET_S, default 400 s; the report gets the last 25 s), so it
#    ends within 8 minutes even when a step hangs; a step that fails or times out does not stop
#    the others. It then writes $OUT/gpu-results.json (schema in the README),
#    $OUT/gpu-results.md (a short table) and $OUT/gpu-run.log (every step's output, cut to its
#    end): three files, nothing else.
#  - Exit 0 when the results were written (whatever they say), 1 when they could not be.
# Steps: preflight (versions; each binary loads with the kit's libraries), the Python module
# built from the kernels-only CMake path (in the background, from the start), the CUDA kernel
# tests, the NCCL test and probe, kernels_bench (packing against a device copy), attention
# against torch, tree attention against FlexAttention, tree-packed against flat bf16 rollouts of a
# tiny model, compute-sanitizer (memcheck on small cases, racecheck on one attention case),
# attention_bench. tests/gpu/report.py turns their outputs into checks.
# Environment: PYTHON (default python3: the one with torch), OUT, PACKSCHED_GPU_KIT_BUDGET_S,
# PACKSCHED_GPU_KIT_SANITIZER (compute-sanitizer's path, or none); PACKSCHED_GPU_KIT_FORCE=1 runs
# every step without a GPU (gpu_kit_test does, on the CPU); PACKSCHED_GPU_KIT_STEPS: the steps to
# run, names separated by spaces (default: every step; the others are recorded as not selected;
# README.md gives the attention-only selections).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
kit=${PACKSCHED_GPU_KIT:-$here}
# From the source tree (tests/gpu/run.sh), the kit prepare.sh made.
if [ ! -f "$kit/manifest.json" ] && [ -f "$here/../../build-gpukit/kit/manifest.json" ]; then
  kit=$(cd "$here/../../build-gpukit/kit" && pwd)
fi

gpu_present() {
  [ "${PACKSCHED_GPU_KIT_FORCE:-0}" = 1 ] && return 0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    return 0
  fi
  compgen -G '/dev/nvidia[0-9]*' >/dev/null
}
if ! gpu_present; then
  echo "no GPU found: GPU checks skipped"
  exit 0
fi

out=${OUT:-./gpu-out}
python=${PYTHON:-python3}
budget=${PACKSCHED_GPU_KIT_BUDGET_S:-400}
reserve=25  # seconds kept for the report at the end
deadline=$((SECONDS + budget))
if [ ! -f "$kit/manifest.json" ]; then
  echo "run.sh: no kit at $kit (run tests/gpu/prepare.sh on the CPU machine first)" >&2
  exit 1
fi
mkdir -p "$out" || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/packsched-gpu.XXXXXX") || exit 1
mkdir -p "$work/logs" "$work/steps" "$work/data"
echo "run.sh: kit $kit, work $work, budget ${budget}s"

# NCCL comes from the GPU machine: the nvidia-nccl wheel of $python, else the system's.
nccl_dir=$("$python" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = [p for p in site.getsitepackages() + sys.path if p and os.path.isdir(p)]
hits = [h for r in roots for h in glob.glob(os.path.join(r, "nvidia", "**", "libnccl.so*"),
                                            recursive=True)]
print(os.path.dirname(sorted(hits)[0]) if hits else "")
EOF
)
if [ -z "$nccl_dir" ]; then
  nccl_lib=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
  [ -n "$nccl_lib" ] && nccl_dir=$(dirname "$nccl_lib")
fi
# Kit binaries only: Python (torch) keeps its own libraries.
kit_ld_path=$kit/lib${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
kit_env=(env "LD_LIBRARY_PATH=$kit_ld_path")

# PACKSCHED_GPU_KIT_SANITIZER: its path, or "none" to skip those steps (gpu_kit_test on the CPU).
sanitizer=${PACKSCHED_GPU_KIT_SANITIZER:-$(command -v compute-sanitizer 2>/dev/null)}
[ "$sanitizer" = none ] && sanitizer=""
[ -z "${PACKSCHED_GPU_KIT_SANITIZER:-}" ] &&
for candidate in /usr/local/cuda/bin/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer \
  /opt/nvidia/compute-sanitizer/compute-sanitizer; do
  [ -z "$sanitizer" ] && [ -x "$candidate" ] && sanitizer=$candidate
done

# step NAME LIMIT_S CMD...: runs CMD (output to logs/NAME.log) under `timeout`, its limit cut to
# the time left before the deadline; records steps/NAME.json (status ran/timeout/skipped, rc,
# seconds, limit). A step that cannot get 10 s is skipped as out of budget.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${PACKSCHED_GPU_KIT_STEPS:-}" ] && [[ " $PACKSCHED_GPU_KIT_STEPS " != *" $name "* ]]; then
    printf '{"name": "%s", "status": "not_selected", "rc": null, "seconds": 0, "limit_s": 0}\n' \
      "$name" >"$work/steps/$name.json"
    return
  fi
  local left=$((deadline - reserve - SECONDS))
  if [ "$left" -lt 10 ]; then
    printf '{"name": "%s", "status": "skipped", "rc": null, "seconds": 0, "limit_s": 0}\n' \
      "$name" >"$work/steps/$name.json"
    echo "run.sh: $name skipped (out of the time budget)"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  echo "run.sh: $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$work/logs/$name.log" 2>&1 </dev/null
  local rc=$? status=ran
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status=timeout
  printf '{"name": "%s", "status": "%s", "rc": %d, "seconds": %d, "limit_s": %d}\n' \
    "$name" "$status" "$rc" $((SECONDS - t0)) "$limit" >"$work/steps/$name.json"
  echo "run.sh: $name $status rc=$rc in $((SECONDS - t0))s"
}

bin=$kit/bin
gtest_json() { echo "--gtest_output=json:$work/data/$1.json"; }
# in_kit STEP BINARY: true when the kit has BINARY; else records STEP as missing (a kit from a
# build without CUDA or NCCL lacks some).
in_kit() {
  [ -x "$bin/$2" ] && return 0
  printf '{"name": "%s", "status": "missing", "rc": null, "seconds": 0, "limit_s": 0}\n' \
    "$1" >"$work/steps/$1.json"
  echo "run.sh: $1 skipped ($2 is not in the kit)"
  return 1
}

echo "nccl_dir=${nccl_dir:-none} sanitizer=${sanitizer:-none}" >"$work/logs/env.log"
step preflight 60 env KIT_LD_PATH="$kit_ld_path" PYTHON="$python" \
  "$kit/scripts/preflight.sh" "$bin"

# The Python module, in the background from the start (CPU only; it ends before the timings).
module_build=$work/module
step build_module 240 "$kit/scripts/build_module.sh" --kit "$kit" --build "$module_build" \
  --python "$python" --jobs 8 &
module_pid=$!

in_kit kernels_cuda_test kernels_cuda_test &&
  step kernels_cuda_test 120 "${kit_env[@]}" "$bin/kernels_cuda_test" \
  "$(gtest_json kernels_cuda_test)"
in_kit kernels_attention_cuda_test kernels_attention_cuda_test &&
  step kernels_attention_cuda_test 180 "${kit_env[@]}" "$bin/kernels_attention_cuda_test" \
  "$(gtest_json kernels_attention_cuda_test)"
in_kit collective_nccl_test collective_nccl_test &&
  step collective_nccl_test 60 "${kit_env[@]}" "$bin/collective_nccl_test" \
  "$(gtest_json collective_nccl_test)"
in_kit nccl_probe nccl_probe &&
  step nccl_probe 60 bash -c "\"\$@\" >'$work/data/nccl_probe.json'" _ "${kit_env[@]}" \
  "$bin/nccl_probe" --rounds=2000

wait "$module_pid"
# The benchmarks time each iteration on the device (manual time) but spend about 1 ms of host
# time on it (launch, event, sync): a 0.2 s minimum of device time ran kernels_bench and
# attention_bench past their limits after a few cases, so each case gets 0.01 s of device time.
min_time=0.01
in_kit kernels_bench kernels_bench &&
  step kernels_bench 90 "${kit_env[@]}" "$bin/kernels_bench" --benchmark_filter=Cuda \
  --benchmark_min_time=$min_time --benchmark_format=json \
  --benchmark_out="$work/data/kernels_bench.json" --benchmark_out_format=json
left=$((deadline - reserve - SECONDS))
step attention_vs_torch 150 env PYTHONPATH="$module_build" \
  LD_LIBRARY_PATH="$kit/module/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  PYTHONUNBUFFERED=1 "$python" "$kit/scripts/attention_vs_torch.py" \
  --out "$work/data/attention_vs_torch.json" --budget-s $((left < 150 ? left - 20 : 130))
left=$((deadline - reserve - SECONDS))
step tree_vs_flex 150 env PYTHONPATH="$module_build" \
  LD_LIBRARY_PATH="$kit/module/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  PYTHONUNBUFFERED=1 "$python" "$kit/scripts/tree_vs_flex.py" \
  --out "$work/data/tree_vs_flex.json" --budget-s $((left < 150 ? left - 20 : 130))
step tree_vs_flat 90 env PYTHONPATH="$module_build" \
  LD_LIBRARY_PATH="$kit/module/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  PYTHONUNBUFFERED=1 "$python" "$kit/scripts/tree_vs_flat.py" --out "$work/data/tree_vs_flat.json"

if [ -n "$sanitizer" ]; then
  small=(HeadDimsArePaddedToTheirBucket GqaWindowsSoftcapAndPaddedLayout
    TailRowsAreDefinedAndNeverKeys)
  small_attention=$(printf 'AttentionCudaTest.%s:' "${small[@]}")
  in_kit memcheck_kernels kernels_cuda_test &&
    step memcheck_kernels 90 "${kit_env[@]}" "$sanitizer" --tool memcheck --error-exitcode 86 \
    --print-limit 20 "$bin/kernels_cuda_test" --gtest_filter='CudaTest.*'
  in_kit memcheck_attention kernels_attention_cuda_test &&
    step memcheck_attention 90 "${kit_env[@]}" "$sanitizer" --tool memcheck --error-exitcode 86 \
    --print-limit 20 "$bin/kernels_attention_cuda_test" --gtest_filter="$small_attention"
  in_kit racecheck_attention kernels_attention_cuda_test &&
    step racecheck_attention 90 "${kit_env[@]}" "$sanitizer" --tool racecheck --error-exitcode 86 \
    --print-limit 20 "$bin/kernels_attention_cuda_test" \
    --gtest_filter='AttentionCudaTest.GqaWindowsSoftcapAndPaddedLayout'
fi
in_kit attention_bench attention_bench &&
  step attention_bench 60 "${kit_env[@]}" "$bin/attention_bench" --benchmark_filter=Cuda \
  --benchmark_min_time=$min_time --benchmark_format=json \
  --benchmark_out="$work/data/attention_bench.json" --benchmark_out_format=json

# The report: gpu-results.json, gpu-results.md and gpu-run.log in $out.
if timeout 60 "$python" "$kit/scripts/report.py" --work "$work" --kit "$kit" --out "$out" \
  --sanitizer "${sanitizer:-}" --elapsed-s "$SECONDS"; then
  echo "run.sh: results in $out (gpu-results.json, gpu-results.md, gpu-run.log)"
  cat "$out/gpu-results.md"
  exit 0
fi
# report.py failed: keep the raw logs where they can be read, and say so.
echo "run.sh: report.py failed; raw logs in $out/gpu-run.log" >&2
for f in "$work"/logs/*.log; do
  echo "===== $(basename "$f")"
  tail -c 200000 "$f"
done >"$out/gpu-run.log"
exit 1
