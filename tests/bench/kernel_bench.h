#ifndef PACKSCHED_TESTS_BENCH_KERNEL_BENCH_H_
#define PACKSCHED_TESTS_BENCH_KERNEL_BENCH_H_

// Helpers shared by the kernel benchmarks (kernels_bench, attention_bench): a tensor on the host
// or copied to the device, skipping the CUDA variants without a device, and the timed loop (wall
// clock on the CPU, CUDA events as manual time on the GPU).

#include <benchmark/benchmark.h>

#include <algorithm>
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
// its message and returns false), then per iteration: wall clock of one call on the CPU; on the
// GPU, CUDA events around a batch of calls issued back to back, reported as manual time per call.
// The batch (counter calls_per_timing) fills about a millisecond of device time, measured once
// before the loop: host-side launch cost then overlaps device work, so a kernel of tens of
// microseconds is timed at the device's rate rather than the launch rate; a long kernel runs
// once per iteration as before.
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
    auto time_ms = [&](int calls) {
      cudaEventRecord(start);
      for (int i = 0; i < calls; ++i) benchmark::DoNotOptimize(call());
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      return static_cast<double>(ms);
    };
    const double one_ms = time_ms(1);
    const int batch =
        one_ms > 0 && one_ms < 1.0 ? std::min(1000, static_cast<int>(1.0 / one_ms)) : 1;
    state.counters["calls_per_timing"] = batch;
    for (auto _ : state) state.SetIterationTime(time_ms(batch) / batch / 1e3);
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
