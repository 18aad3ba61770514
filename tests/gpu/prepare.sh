#!/usr/bin/env bash
# Prepares the GPU kit on the CPU machine (tests/gpu/README.md).
#
#   tests/gpu/prepare.sh        from the repository root or anywhere; JOBS=N to change -j
#
# Contract: from a fresh clone (it installs the build's packages with deploy/install-deps.sh and
# builds everything it uses), configures build-gpukit/build for CUDA architectures sm_80 and
# sm_90 (the kit's own; CI's build/ keeps its architectures) with the fatbinaries compressed for
# size (each binary links all the kernels' device code: uncompressed the kit is over 60 MiB),
# builds only the kit's targets, and
# assembles the kit in build-gpukit/kit (ignored by git): the CUDA kernel tests, the benchmarks,
# the NCCL test and probe, their shared libraries, the kernels-only CMake path of the Python
# module, and the scripts. Fails (exit 1) if nvcc or NCCL is missing, a target does not build, or
# the kit is over 60 MiB. About 4 minutes on 2 cores (3 of them nvcc), seconds when rerun.
# Then copy build-gpukit/kit (or the whole checkout) to the GPU machine and run its run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."

start=$SECONDS
build=build-gpukit/build
kit=build-gpukit/kit
max_mib=60
targets=(packsched_kernels kernels_cuda_test kernels_attention_cuda_test collective_nccl_test
         kernels_bench attention_bench nccl_probe)

./deploy/install-deps.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="80-real;90-real" -DCMAKE_CUDA_FLAGS="--compress-mode=size" \
  -DPACKSCHED_WITH_CUDA=ON \
  -DPACKSCHED_WITH_NCCL=ON -DPACKSCHED_WITH_PYTHON=OFF -DPACKSCHED_WITH_TESTS=ON \
  -DPACKSCHED_WITH_BENCHMARKS=ON
for option in PACKSCHED_WITH_CUDA PACKSCHED_WITH_NCCL; do
  if ! grep -q "^$option:BOOL=ON" "$build/CMakeCache.txt"; then
    echo "prepare.sh: $option is off (nvcc or NCCL not found): the kit needs both" >&2
    exit 1
  fi
done
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${targets[@]}"
/usr/bin/python3 tests/gpu/assemble_kit.py assemble --build "$build" --kit "$kit" --require-all
/usr/bin/python3 tests/gpu/assemble_kit.py verify --kit "$kit"

size_kib=$(du -sk "$kit" | cut -f1)
if [ "$size_kib" -gt $((max_mib * 1024)) ]; then
  echo "prepare.sh: the kit is $((size_kib / 1024)) MiB, over the $max_mib MiB limit" >&2
  exit 1
fi
echo "prepare.sh: kit ready in $kit ($((size_kib / 1024)) MiB) after $((SECONDS - start)) s"
echo "prepare.sh: on the GPU machine, beside the source tree: $kit/run.sh" \
  "(results in \$OUT, default ./gpu-out)"
