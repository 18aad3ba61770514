// Throughput of the packing kernels: bytes each call must move (read + write) per second.
//
//   build/bin/kernels_bench                           all CPU benchmarks
//   build/bin/kernels_bench --benchmark_filter=Cuda   the GPU path (needs a device; reports
//                                                     achieved bandwidth and, when the runtime
//                                                     reports the memory clock, the share of peak)
//
// Workload: 16 sequences of 128..4096 tokens (about 33k tokens), hidden 512 in bfloat16 for the
// copy kernels (on the GPU also hidden 4096: a working set far larger than the L2 cache);
// 256 tokens x 32000 vocabulary for cross entropy. BM_DeviceCopy/Cuda is the baseline of the
// copy kernels: cudaMemcpyAsync device to device of one packed [tokens, hidden] tensor, timed
// the same way in the same run (tests/gpu/report.py divides each kernel's bytes/s by it).

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "packsched/kernels/context_parallel.h"
#include "packsched/kernels/kernels.h"
#include "tests/bench/kernel_bench.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels {
namespace {

using testing::Buffer;
using testing::HostTensor;
using testing::SkipWithoutDevice;
using testing::TimedLoop;

constexpr int64_t kVocab = 32000;
constexpr int64_t kCeRows = 256;
constexpr int64_t kAlign = 64;

struct Workload {
  std::vector<int32_t> lengths, cu, cu_padded;
  int64_t batch = 16, seqlen = 4096;
  Workload() {
    std::mt19937 rng(42);
    for (int64_t b = 0; b < batch; ++b) lengths.push_back(128 + rng() % (seqlen - 127));
    cu = testing::CuSeqlens(lengths);
    cu_padded = *AlignedCuSeqlens(cu, kAlign);
  }
  std::vector<uint8_t> Mask() const {
    std::vector<uint8_t> m(batch * seqlen, 0);
    for (int64_t b = 0; b < batch; ++b) std::fill_n(m.begin() + b * seqlen, lengths[b], 1);
    return m;
  }
};

HostTensor Bf16Rows(int64_t rows, int64_t width) {
  HostTensor t(std::vector<int64_t>{rows, width}, testing::DTypeOf<Bf16>());
  t.FillRandomBytes(1);
  return t;
}

// Runs `call` once per iteration and reports `bytes` moved per call. CUDA calls are timed with
// events (manual time), so the figure is the device's achieved bandwidth.
void Run(benchmark::State& state, bool cuda, int64_t bytes,
         const std::function<absl::Status()>& call) {
  if (!TimedLoop(state, cuda, call)) return;
#if PACKSCHED_KERNELS_WITH_CUDA
  int clock_khz = 0, bus_bits = 0;
  if (cuda && cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0) == cudaSuccess &&
      clock_khz > 0) {
    const double peak = 2.0 * clock_khz * 1e3 * bus_bits / 8;  // double data rate, bytes/s
    state.counters["peak_GBps"] = peak / 1e9;
    state.counters["of_peak"] = benchmark::Counter(static_cast<double>(bytes) / peak,
                                                   benchmark::Counter::kIsIterationInvariantRate);
  }
#endif
  state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_Unpad(benchmark::State& state, bool cuda) {
  if (SkipWithoutDevice(state, cuda)) return;
  const int64_t hidden = state.range(0);
  Workload w;
  const int64_t total = w.cu.back();
  Buffer x(HostTensor(std::vector<int64_t>{w.batch, w.seqlen, hidden}, testing::DTypeOf<Bf16>()),
           cuda);
  Buffer mask(HostTensor::Of<uint8_t>({w.batch, w.seqlen}, w.Mask()), cuda);
  Buffer cu(testing::CuTensor(w.cu), cuda);
  Buffer out(Bf16Rows(total, hidden), cuda);
  Buffer indices(HostTensor::Zeros<int64_t>({total}), cuda);
  const int64_t bytes = mask.nbytes() + 2 * out.nbytes() + indices.nbytes();
  Run(state, cuda, bytes, [&] {
    return Unpad(x.view(), mask.view(), {&cu.view(), w.cu}, out.view(), indices.view(), nullptr);
  });
}

void BM_Pad(benchmark::State& state, bool cuda) {
  if (SkipWithoutDevice(state, cuda)) return;
  const int64_t hidden = state.range(0);
  Workload w;
  const int64_t total = w.cu.back();
  std::vector<int64_t> idx;
  for (int64_t b = 0; b < w.batch; ++b) {
    for (int32_t i = 0; i < w.lengths[b]; ++i) idx.push_back(b * w.seqlen + i);
  }
  Buffer packed(Bf16Rows(total, hidden), cuda);
  Buffer indices(HostTensor::Of<int64_t>({total}, idx), cuda);
  Buffer x(HostTensor(std::vector<int64_t>{w.batch, w.seqlen, hidden}, testing::DTypeOf<Bf16>()),
           cuda);
  const int64_t bytes = packed.nbytes() + indices.nbytes() + x.nbytes();
  Run(state, cuda, bytes, [&] { return Pad(packed.view(), indices.view(), x.view(), nullptr); });
}

void BM_PackAligned(benchmark::State& state, bool cuda) {
  if (SkipWithoutDevice(state, cuda)) return;
  const int64_t hidden = state.range(0);
  Workload w;
  Buffer packed(Bf16Rows(w.cu.back(), hidden), cuda);
  Buffer cu(testing::CuTensor(w.cu), cuda);
  Buffer aligned(Bf16Rows(w.cu_padded.back(), hidden), cuda);
  Buffer cu_padded(testing::CuTensor(w.cu_padded), cuda);
  Buffer seqused(HostTensor::Zeros<int32_t>({w.batch}), cuda);
  const int64_t bytes = packed.nbytes() + aligned.nbytes();
  Run(state, cuda, bytes, [&] {
    return PackAligned(packed.view(), {&cu.view(), w.cu}, kAlign, -1, 0.0, aligned.view(),
                       cu_padded.view(), seqused.view(), nullptr);
  });
}

void BM_UnpackAligned(benchmark::State& state, bool cuda) {
  if (SkipWithoutDevice(state, cuda)) return;
  const int64_t hidden = state.range(0);
  Workload w;
  Buffer aligned(Bf16Rows(w.cu_padded.back(), hidden), cuda);
  Buffer cu(testing::CuTensor(w.cu), cuda);
  Buffer cu_padded(testing::CuTensor(w.cu_padded), cuda);
  Buffer packed(Bf16Rows(w.cu.back(), hidden), cuda);
  const int64_t bytes = 2 * packed.nbytes();
  Run(state, cuda, bytes, [&] {
    return UnpackAligned(aligned.view(), {&cu.view(), w.cu}, {&cu_padded.view(), w.cu_padded},
                         packed.view(), nullptr);
  });
}

void BM_PositionIds(benchmark::State& state, bool cuda) {
  if (SkipWithoutDevice(state, cuda)) return;
  Workload w;
  Buffer cu(testing::CuTensor(w.cu), cuda);
  Buffer pos(HostTensor::Zeros<int64_t>({w.cu.back()}), cuda);
  Run(state, cuda, pos.nbytes(), [&] {
    return PositionIds({&cu.view(), w.cu}, pos.view(), nullptr);
  });
}

void BM_ShiftLabels(benchmark::State& state, bool cuda) {
  if (SkipWithoutDevice(state, cuda)) return;
  Workload w;
  Buffer cu(testing::CuTensor(w.cu), cuda);
  Buffer ids(HostTensor::Zeros<int64_t>({w.cu.back()}), cuda);
  Buffer labels(HostTensor::Zeros<int64_t>({w.cu.back()}), cuda);
  Run(state, cuda, ids.nbytes() + labels.nbytes(), [&] {
    return ShiftLabels(ids.view(), {&cu.view(), w.cu}, nullptr, -100, labels.view(), nullptr);
  });
}

template <typename T>
void BM_CrossEntropy(benchmark::State& state, bool cuda) {
  if (SkipWithoutDevice(state, cuda)) return;
  const std::vector<int32_t> cu_host = {0, kCeRows / 2, kCeRows};
  HostTensor logits_host(std::vector<int64_t>{kCeRows, kVocab}, testing::DTypeOf<T>());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < logits_host.numel(); ++i) {
    logits_host.data<T>()[i] = FromAcc<T>(static_cast<Acc<T>>(normal(rng)));
  }
  std::vector<int64_t> label_values(kCeRows);
  for (auto& l : label_values) l = rng() % kVocab;
  Buffer logits(std::move(logits_host), cuda);
  Buffer labels(HostTensor::Of<int64_t>({kCeRows}, label_values), cuda);
  Buffer cu(testing::CuTensor(cu_host), cuda);
  Buffer loss(HostTensor(std::vector<int64_t>{kCeRows}, testing::DTypeOf<T>()), cuda);
  Buffer sums(HostTensor(std::vector<int64_t>{2}, testing::DTypeOf<T>()), cuda);
  Buffer counts(HostTensor::Zeros<int64_t>({2}), cuda);
  Run(state, cuda, logits.nbytes() + labels.nbytes() + loss.nbytes(), [&] {
    return PackedCrossEntropy(logits.view(), labels.view(), {&cu.view(), cu_host}, -100,
                              loss.view(), sums.view(), counts.view(), nullptr);
  });
}

// Context parallelism: every CP rank's shard of the aligned workload (cp = 4, so each call of the
// loop moves the whole tensor once: read + written), and the inverse. BM_HostCopy is their CPU
// baseline: one memcpy of the same bytes.
constexpr int64_t kCp = 4;

// Every CP rank's shard of one packed micro-batch (`unshard`: and back), all ranks in turn.
void CpShards(benchmark::State& state, bool cuda, bool unshard) {
  if (SkipWithoutDevice(state, cuda)) return;
  Workload w;  // cu_padded: every length a multiple of kAlign = 64, so of 2 * kCp
  Buffer x(Bf16Rows(w.cu_padded.back(), state.range(0)), cuda);
  Buffer cu(testing::CuTensor(w.cu_padded), cuda);
  std::vector<std::unique_ptr<Buffer>> shards;
  for (int64_t r = 0; r < kCp; ++r) {
    shards.push_back(
        std::make_unique<Buffer>(Bf16Rows(w.cu_padded.back() / kCp, state.range(0)), cuda));
  }
  Run(state, cuda, 2 * x.nbytes(), [&] {
    for (int64_t r = 0; r < kCp; ++r) {
      const Seqlens seqlens{&cu.view(), w.cu_padded};
      const absl::Status s = unshard
                                 ? CpUnshard(shards[r]->view(), seqlens, kCp, r, x.view(), nullptr)
                                 : CpShard(x.view(), seqlens, kCp, r, shards[r]->view(), nullptr);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

void BM_CpShard(benchmark::State& state, bool cuda) { CpShards(state, cuda, false); }
void BM_CpUnshard(benchmark::State& state, bool cuda) { CpShards(state, cuda, true); }

// The CPU baseline of the copy kernels: one memcpy of the aligned [tokens, hidden] tensor.
void BM_HostCopy(benchmark::State& state) {
  Workload w;
  HostTensor from = Bf16Rows(w.cu_padded.back(), state.range(0));
  HostTensor to = Bf16Rows(w.cu_padded.back(), state.range(0));
  Run(state, false, 2 * from.nbytes(), [&] {
    std::memcpy(to.view().data, from.view().data, from.nbytes());
    benchmark::ClobberMemory();
    return absl::OkStatus();
  });
}

// The baseline of the copy kernels: one packed [tokens, hidden] bfloat16 tensor copied device to
// device (bytes read + written), the same tokens as the kernels' workload.
void BM_DeviceCopy(benchmark::State& state, bool cuda) {
  if (SkipWithoutDevice(state, cuda)) return;
#if PACKSCHED_KERNELS_WITH_CUDA
  Workload w;
  Buffer from(Bf16Rows(w.cu.back(), state.range(0)), cuda);
  Buffer to(Bf16Rows(w.cu.back(), state.range(0)), cuda);
  Run(state, cuda, 2 * from.nbytes(), [&] {
    const cudaError_t e = cudaMemcpyAsync(to.view().data, from.view().data, from.nbytes(),
                                          cudaMemcpyDeviceToDevice, nullptr);
    return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
  });
#endif
}

#define PACKSCHED_BENCH_BOTH(fn)                                    \
  BENCHMARK_CAPTURE(fn, Cpu, false)->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(fn, Cuda, true)->UseManualTime()->Unit(benchmark::kMicrosecond)

// The copy kernels take the hidden size as their argument: 512 on the CPU, 512 and 4096 on the GPU.
#define PACKSCHED_BENCH_HIDDEN(fn)                                                               \
  BENCHMARK_CAPTURE(fn, Cpu, false)->ArgName("hidden")->Arg(512)->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(fn, Cuda, true)                                                              \
      ->ArgName("hidden")                                                                        \
      ->Arg(512)                                                                                 \
      ->Arg(4096)                                                                                \
      ->UseManualTime()                                                                          \
      ->Unit(benchmark::kMicrosecond)

PACKSCHED_BENCH_HIDDEN(BM_Unpad);
PACKSCHED_BENCH_HIDDEN(BM_Pad);
PACKSCHED_BENCH_HIDDEN(BM_PackAligned);
PACKSCHED_BENCH_HIDDEN(BM_UnpackAligned);
PACKSCHED_BENCH_HIDDEN(BM_CpShard);
PACKSCHED_BENCH_HIDDEN(BM_CpUnshard);
BENCHMARK(BM_HostCopy)->ArgName("hidden")->Arg(512)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DeviceCopy, Cuda, true)
    ->ArgName("hidden")
    ->Arg(512)
    ->Arg(4096)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
PACKSCHED_BENCH_BOTH(BM_PositionIds);
PACKSCHED_BENCH_BOTH(BM_ShiftLabels);
void BM_CrossEntropyF32(benchmark::State& state, bool cuda) { BM_CrossEntropy<float>(state, cuda); }
void BM_CrossEntropyBf16(benchmark::State& state, bool cuda) { BM_CrossEntropy<Bf16>(state, cuda); }
PACKSCHED_BENCH_BOTH(BM_CrossEntropyF32);
PACKSCHED_BENCH_BOTH(BM_CrossEntropyBf16);

}  // namespace
}  // namespace packsched::kernels

BENCHMARK_MAIN();
