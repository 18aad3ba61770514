// Varlen attention throughput: tokens per second (items_per_second) and achieved TFLOP/s of the
// forward and the backward, causal, bfloat16.
//
//   build/bin/attention_bench --benchmark_filter=Cpu    CPU, wall-clock rates (slow: seconds per
//                                                       iteration)
//   build/bin/attention_bench --benchmark_filter=Cuda   the GPU path (needs a device; timed with
//                                                       CUDA events); CudaScalar: the scalar
//                                                       kernels, for comparison
//
// Arguments: sequences, tokens per sequence, H, Hk, D. FLOPs count only visible (query, key)
// pairs: forward 4·D per pair (Q·Kᵀ and P·V), backward 2.5x the forward (FlashAttention's
// convention: five matmuls against two).

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/half.h"
#include "packsched/kernels/attention.h"
#include "tests/bench/kernel_bench.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels {
namespace {

using testing::Buffer;
using testing::HostTensor;
using testing::SkipWithoutDevice;
using testing::TimedLoop;

HostTensor RandomBf16(std::vector<int64_t> shape, uint32_t seed) {
  HostTensor t(std::move(shape), testing::DTypeOf<Bf16>());
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<Bf16>()[i] = FloatToBf16(normal(rng));
  return t;
}

// One causal problem of `seqs` sequences of `len` tokens, inputs and outputs allocated.
struct Problem {
  Problem(benchmark::State& state, bool cuda)
      : seqs(state.range(0)),
        len(state.range(1)),
        heads(state.range(2)),
        kv_heads(state.range(3)),
        dim(state.range(4)),
        cu_host(testing::CuSeqlens(std::vector<int32_t>(seqs, static_cast<int32_t>(len)))),
        q(RandomBf16({seqs * len, heads, dim}, 1), cuda),
        k(RandomBf16({seqs * len, kv_heads, dim}, 2), cuda),
        v(RandomBf16({seqs * len, kv_heads, dim}, 3), cuda),
        dout(RandomBf16({seqs * len, heads, dim}, 4), cuda),
        out(RandomBf16({seqs * len, heads, dim}, 5), cuda),
        dq(RandomBf16({seqs * len, heads, dim}, 6), cuda),
        dk(RandomBf16({seqs * len, kv_heads, dim}, 7), cuda),
        dv(RandomBf16({seqs * len, kv_heads, dim}, 8), cuda),
        lse(HostTensor::Zeros<float>({heads, seqs * len}), cuda),
        cu(testing::CuTensor(cu_host), cuda) {
    seqlens.q = {&cu.view(), cu_host};
    seqlens.k = {&cu.view(), cu_host};
    seqlens.max_seqlen_q = seqlens.max_seqlen_k = len;
    options.causal = true;
  }
  int64_t Tokens() const { return seqs * len; }
  double ForwardFlops() const { return 4.0 * dim * heads * seqs * (len * (len + 1) / 2.0); }
  absl::Status Forward() {
    return VarlenAttentionForward(q.view(), k.view(), v.view(), seqlens, options, out.view(),
                                  lse.view(), nullptr);
  }
  absl::Status Backward() {
    return VarlenAttentionBackward(dout.view(), q.view(), k.view(), v.view(), out.view(),
                                   lse.view(), seqlens, options, dq.view(), dk.view(), dv.view(),
                                   nullptr);
  }

  int64_t seqs, len, heads, kv_heads, dim;
  std::vector<int32_t> cu_host;
  Buffer q, k, v, dout, out, dq, dk, dv, lse, cu;
  AttentionSeqlens seqlens;
  AttentionOptions options;
};

void Run(benchmark::State& state, bool cuda, int64_t tokens, double flops,
         const std::function<absl::Status()>& call) {
  if (!TimedLoop(state, cuda, call)) return;
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["TFLOPs"] = benchmark::Counter(
      flops / 1e12, benchmark::Counter::kIsRate | benchmark::Counter::kIsIterationInvariant);
}

// Where a case runs: the CPU backend, the CUDA backend's default path (the tensor-core kernels for
// these bf16, D = 128 shapes on sm_80+; 128-row query tiles in the forward), the tensor-core
// forward with 64-row tiles (PACKSCHED_ATTENTION_TC_FWD_TILE=64), or the scalar kernels
// (PACKSCHED_ATTENTION_SCALAR=1); each variable set for the case's duration.
enum class Path { kCpu, kCuda, kCudaTile64, kCudaScalar };

class PathEnvironment {
 public:
  explicit PathEnvironment(Path path)
      : name_(path == Path::kCudaScalar   ? "PACKSCHED_ATTENTION_SCALAR"
              : path == Path::kCudaTile64 ? "PACKSCHED_ATTENTION_TC_FWD_TILE"
                                          : nullptr) {
    if (name_ != nullptr) setenv(name_, path == Path::kCudaScalar ? "1" : "64", 1);
  }
  ~PathEnvironment() {
    if (name_ != nullptr) unsetenv(name_);
  }

 private:
  const char* name_;
};

void BM_AttentionForward(benchmark::State& state, Path path) {
  const bool cuda = path != Path::kCpu;
  if (SkipWithoutDevice(state, cuda)) return;
  const PathEnvironment environment(path);
  Problem p(state, cuda);
  Run(state, cuda, p.Tokens(), p.ForwardFlops(), [&] { return p.Forward(); });
}

void BM_AttentionBackward(benchmark::State& state, Path path) {
  const bool cuda = path != Path::kCpu;
  if (SkipWithoutDevice(state, cuda)) return;
  const PathEnvironment environment(path);
  Problem p(state, cuda);
  if (!p.Forward().ok()) {
    state.SkipWithError("forward failed");
    return;
  }
  Run(state, cuda, p.Tokens(), 2.5 * p.ForwardFlops(), [&] { return p.Backward(); });
}

// sequences, tokens each, H, Hk, D
#define PACKSCHED_ATTENTION_SHAPES(b) \
  b->Args({8, 1024, 16, 16, 128})     \
      ->Args({8, 1024, 16, 4, 128})   \
      ->ArgNames({"seqs", "len", "H", "Hk", "D"})

PACKSCHED_ATTENTION_SHAPES(BENCHMARK_CAPTURE(BM_AttentionForward, Cpu, Path::kCpu))
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);
PACKSCHED_ATTENTION_SHAPES(BENCHMARK_CAPTURE(BM_AttentionBackward, Cpu, Path::kCpu))
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
PACKSCHED_ATTENTION_SHAPES(BENCHMARK_CAPTURE(BM_AttentionForward, Cuda, Path::kCuda))
    ->Args({16, 4096, 32, 8, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
PACKSCHED_ATTENTION_SHAPES(BENCHMARK_CAPTURE(BM_AttentionBackward, Cuda, Path::kCuda))
    ->Args({16, 4096, 32, 8, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
PACKSCHED_ATTENTION_SHAPES(BENCHMARK_CAPTURE(BM_AttentionForward, CudaTile64, Path::kCudaTile64))
    ->Args({16, 4096, 32, 8, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
PACKSCHED_ATTENTION_SHAPES(BENCHMARK_CAPTURE(BM_AttentionForward, CudaScalar, Path::kCudaScalar))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
PACKSCHED_ATTENTION_SHAPES(BENCHMARK_CAPTURE(BM_AttentionBackward, CudaScalar, Path::kCudaScalar))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace packsched::kernels

BENCHMARK_MAIN();
