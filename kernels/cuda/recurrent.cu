// The CUDA launchers of the recurrent kernels (recurrent.h) over the device code of
// recurrent_device.cuh. Workspace: rows x heads x K x V doubles (two such for the recurrence's
// backward; rows x channels for the convolution's), from the device pool of
// attention_tc_workspace.cuh, freed stream-ordered after the kernels.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_tc_workspace.cuh"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/cuda/recurrent_device.cuh"
#include "kernels/cuda/recurrent_launch.h"

namespace packsched::kernels::internal::cuda {
namespace {

int Blocks(int64_t items) {
  const int64_t blocks = (items + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

// Workspace of `bytes` (zeroed when asked); frees it after the kernels enqueued by `launch`.
template <typename Launch>
LaunchResult WithWorkspace(size_t bytes, bool zero, cudaStream_t stream, Launch launch) {
  void* ws = nullptr;
  cudaError_t e = TcWorkspaceAllocate(bytes, stream, &ws);
  if (e == cudaSuccess && zero) e = cudaMemsetAsync(ws, 0, bytes, stream);
  if (e == cudaSuccess) {
    launch(static_cast<double*>(ws));
    e = cudaGetLastError();
  }
  if (ws != nullptr) {
    const cudaError_t f = cudaFreeAsync(ws, stream);
    if (e == cudaSuccess) e = f;
  }
  return ResultOf(e);
}

template <typename T>
LaunchResult ConvTyped(const ConvArgs& a, bool backward, cudaStream_t s) {
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  if (!backward) {
    if (a.rows * a.channels == 0) return ResultOf(cudaSuccess);
    ConvForwardKernel<T><<<Blocks(a.rows * a.channels), kBlock, 0, s>>>(
        x, w, bias, a.prev_row, a.rows, a.channels, a.width, a.silu, static_cast<T*>(a.out));
    return ResultOf(cudaGetLastError());
  }
  if (a.channels == 0) return ResultOf(cudaSuccess);
  const size_t bytes = sizeof(double) * static_cast<size_t>(a.rows > 0 ? a.rows : 1) * a.channels;
  return WithWorkspace(bytes, /*zero=*/true, s, [&](double* dx_acc) {
    ConvBackwardKernel<T><<<Blocks(a.channels), kBlock, 0, s>>>(
        x, w, bias, a.prev_row, a.rows, a.channels, a.width, a.silu, static_cast<const T*>(a.d_out),
        dx_acc, static_cast<T*>(a.dx), static_cast<T*>(a.d_weight), static_cast<T*>(a.d_bias));
  });
}

template <typename T>
LaunchResult RecurrenceTyped(const RecurrenceArgs& a, bool backward, cudaStream_t s) {
  if (a.rows == 0 || a.heads == 0) return ResultOf(cudaSuccess);
  const size_t state_bytes = sizeof(double) * static_cast<size_t>(a.rows) * a.heads * a.kd * a.vd;
  if (!backward) {
    return WithWorkspace(state_bytes, /*zero=*/false, s, [&](double* states) {
      RecurrenceForwardKernel<T><<<static_cast<int>(a.heads), kBlock, 0, s>>>(a, states);
    });
  }
  return WithWorkspace(2 * state_bytes, /*zero=*/true, s, [&](double* ws) {
    RecurrenceBackwardKernel<T>
        <<<static_cast<int>(a.heads), kBlock, 0, s>>>(a, ws, ws + state_bytes / sizeof(double));
  });
}

}  // namespace

LaunchResult LaunchCausalConv1d(const ConvArgs& a, bool backward, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return a.dtype == FloatType::kF64 ? ConvTyped<double>(a, backward, s)
                                    : ConvTyped<float>(a, backward, s);
}

LaunchResult LaunchGatedRecurrence(const RecurrenceArgs& a, bool backward, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return a.dtype == FloatType::kF64 ? RecurrenceTyped<double>(a, backward, s)
                                    : RecurrenceTyped<float>(a, backward, s);
}

}  // namespace packsched::kernels::internal::cuda
