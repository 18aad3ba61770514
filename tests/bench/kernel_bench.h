#ifndef PACKSCHED_TESTS_BENCH_KERNEL_BENCH_H_
#define PACKSCHED_TESTS_BENCH_KERNEL_BENCH_H_

// Helpers shared by the kernel benchmarks (kernels_bench, attention_bench): a tensor on the host
// or copied to the device, skipping the CUDA variants without a device, and the timed loop (wall
// clock on the CPU, CUDA events as manual time on the GPU).

#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "dlpack/dlpack.h"
#include "tests/kernels/host_tensor.h"

#if PACKSCHED_KERNELS_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace packsched::kernels::testing {

// A tensor for a benchmark, on the host or (copied) on the device.
class Buffer {
 public:
  Buffer(HostTensor host, bool cuda) : host_(std::move(host)), view_(host_.view()) {
#if PACKSCHED_KERNELS_WITH_CUDA
    if (cuda) {
      cudaMalloc(&view_.data, host_.nbytes() + 16);
      cudaMemcpy(view_.data, host_.view().data, host_.nbytes(), cudaMemcpyHostToDevice);
      view_.device = {kDLCUDA, 0};
      device_ = true;
    }
#endif
  }
  ~Buffer() {
#if PACKSCHED_KERNELS_WITH_CUDA
    if (device_) cudaFree(view_.data);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  const DLTensor& view() const { return view_; }
  int64_t nbytes() const { return host_.nbytes(); }

 private:
  HostTensor host_;
  DLTensor view_;
  bool device_ = false;
};

// Skips a CUDA variant (with the reason) when there is no device or no CUDA build.
inline bool SkipWithoutDevice(benchmark::State& state, bool cuda) {
#if PACKSCHED_KERNELS_WITH_CUDA
  int count = 0;
  if (cuda && (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
#else
  if (cuda) state.SkipWithError("built without CUDA");
  return cuda;
#endif
}

// Calls `call` once as a warm-up and a check of its arguments (a failure skips the benchmark with
// its message and returns false), then once per iteration: wall clock on the CPU; on the GPU
// timed with CUDA events and reported as manual time.
inline bool TimedLoop(benchmark::State& state, bool cuda,
                      const std::function<absl::Status()>& call) {
  if (const absl::Status s = call(); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return false;
  }
#if PACKSCHED_KERNELS_WITH_CUDA
  if (cuda) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (auto _ : state) {
      cudaEventRecord(start);
      benchmark::DoNotOptimize(call());
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      state.SetIterationTime(ms / 1e3);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return true;
  }
#endif
  for (auto _ : state) benchmark::DoNotOptimize(call());
  return true;
}

}  // namespace packsched::kernels::testing

#endif  // PACKSCHED_TESTS_BENCH_KERNEL_BENCH_H_
