// The tensor-core attention forward: launcher, the choice between it and the scalar kernels, and
// its 8 instantiations (fp16, bf16 x head dims 64 and 96 with 128-row query tiles, head dim 128
// with 64- or 128-row tiles). Device code in attention_tc_fwd.cuh.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/common/half.h"
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_fwd.cuh"
#include "kernels/cuda/attention_tc_launch.h"
#include "kernels/cuda/attention_tc_traits.h"
#include "kernels/cuda/launch_result.cuh"

namespace packsched::kernels::internal::cuda {

namespace {

bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Read on every call, so that a process can time both paths.
bool ForcedScalar() {
  const char* v = std::getenv("PACKSCHED_ATTENTION_SCALAR");
  return v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
}

// Query rows per tile of the D = 128 forward: 64 when PACKSCHED_ATTENTION_TC_FWD_TILE is "64",
// else 128 (read on every call, so that a process can time both).
int ForwardTileD128() {
  const char* v = std::getenv("PACKSCHED_ATTENTION_TC_FWD_TILE");
  return v != nullptr && std::strcmp(v, "64") == 0 ? 64 : 128;
}

template <typename T, int kD, int kM>
cudaError_t RunForward(const TcAttnParams& p, cudaStream_t stream) {
  using Tr = TcTraits<kD, TcKernel::kForward, kM>;
  dim3 grid;
  if (!TcGrid(p.args, p.args.max_seqlen_q, Tr::kBr, p.args.heads, /*keys=*/false, &grid)) {
    return cudaErrorInvalidConfiguration;
  }
  auto* kernel = AttentionTcForwardKernel<T, kD, kM>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(Tr::kSharedBytes));
  if (e != cudaSuccess) return e;
  kernel<<<grid, Tr::kThreads, Tr::kSharedBytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t ForwardHeadDim(const TcAttnParams& p, cudaStream_t stream) {
  return WithTcHeadDim(p.args.head_dim, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    if constexpr (kD == 128) {
      if (ForwardTileD128() == 64) return RunForward<T, 128, 1>(p, stream);
    }
    return RunForward<T, kD, 2>(p, stream);
  });
}

}  // namespace

bool AttentionTcApplies(const AttentionArgs& a) {
  if (a.dtype != FloatType::kBf16 && a.dtype != FloatType::kF16) return false;
  if (!TcHeadDim(static_cast<int>(a.head_dim))) return false;
  for (const void* t :
       {a.q, a.k, a.v, a.dout, static_cast<const void*>(a.out), static_cast<const void*>(a.dq),
        static_cast<const void*>(a.dk), static_cast<const void*>(a.dv)}) {
    if (!Aligned16(t)) return false;
  }
  if (ForcedScalar()) return false;
  int device = 0;
  int major = 0;
  int optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return false;  // the scalar path reports the error
  }
  return major >= 8 && TcFitsSharedMemory(a.head_dim, static_cast<size_t>(optin));
}

LaunchResult LaunchAttentionTcForward(const TcAttnParams& p, void* stream) {
  if (p.args.total_q == 0) return ResultOf(cudaSuccess);
  const auto s = static_cast<cudaStream_t>(stream);
  return ResultOf(p.args.dtype == FloatType::kBf16 ? ForwardHeadDim<Bf16>(p, s)
                                                   : ForwardHeadDim<Fp16>(p, s));
}

}  // namespace packsched::kernels::internal::cuda
