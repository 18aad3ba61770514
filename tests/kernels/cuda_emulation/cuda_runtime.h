#ifndef PACKSCHED_TESTS_KERNELS_CUDA_EMULATION_CUDA_RUNTIME_H_
#define PACKSCHED_TESTS_KERNELS_CUDA_EMULATION_CUDA_RUNTIME_H_

// A stand-in for <cuda_runtime.h> that lets the CUDA attention's device code
// (kernels/cuda/attention_device.cuh) compile as plain C++ and run on the CPU, one std::thread per
// CUDA thread, one block at a time, with __syncthreads as a std::barrier. Only what that device
// code uses is provided. Test-only: attention_emulated_test.cc puts this directory first on its
// include path and defines the block's shared memory. warp_runtime.h runs a block as fibers
// instead (warp-accurate, for the tensor-core kernels); __syncthreads then goes to its barrier.

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

#define __global__
#define __device__
#define __host__
#define __shared__
#define __launch_bounds__(...)

namespace packsched_cuda_emulation {
inline thread_local dim3 thread_idx;  // this emulated thread's threadIdx
inline dim3 block_idx;                // the block being run (one at a time)
inline dim3 grid_dim;                 // the grid it belongs to (warp_runtime.h's RunGrid)
inline std::barrier<>* block_barrier = nullptr;
inline void (*fiber_sync_threads)() = nullptr;  // set while warp_runtime.h runs a block
}  // namespace packsched_cuda_emulation

#define threadIdx ::packsched_cuda_emulation::thread_idx
#define blockIdx ::packsched_cuda_emulation::block_idx
#define gridDim ::packsched_cuda_emulation::grid_dim

inline void __syncthreads() {
  if (packsched_cuda_emulation::fiber_sync_threads != nullptr) {
    packsched_cuda_emulation::fiber_sync_threads();
  } else {
    packsched_cuda_emulation::block_barrier->arrive_and_wait();
  }
}

namespace packsched_cuda_emulation {
inline std::atomic<uint64_t> atomic_adds{0};  // atomicAdd calls, for the tests
}  // namespace packsched_cuda_emulation

// atomicAdd on a float in global memory (4-byte aligned, else the run aborts): a real atomic
// read-modify-write, so it holds under both runtimes (std::thread blocks run concurrently; the
// fibers of warp_runtime.h switch only at barriers and collectives anyway). Returns the old
// value, as CUDA's does.
inline float atomicAdd(float* address, float value) {
  if (reinterpret_cast<uintptr_t>(address) % alignof(float) != 0) {
    std::fprintf(stderr, "cuda emulation: atomicAdd on an unaligned float\n");
    std::abort();
  }
  ++packsched_cuda_emulation::atomic_adds;
  return std::atomic_ref<float>(*address).fetch_add(value);
}

#endif  // PACKSCHED_TESTS_KERNELS_CUDA_EMULATION_CUDA_RUNTIME_H_
