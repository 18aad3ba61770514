#ifndef PACKSCHED_KERNELS_CUDA_PTX_CUH_
#define PACKSCHED_KERNELS_CUDA_PTX_CUH_

// Every PTX instruction the tensor-core attention uses, behind small inline functions: the warp's
// matrix multiply-accumulate (mma.sync m16n8k16, bf16 or fp16 inputs, float accumulators), the
// warp's shared-memory matrix loads (ldmatrix x1/x2/x4, with and without .trans), asynchronous
// global-to-shared copies (cp.async with commit_group / wait_group), warp shuffles and the packing
// of two floats into a 16-bit pair, 16-byte read-only global loads, the fast base-2 exponential and
// a warp vote. Nothing else in the kernels is inline assembly, so a CPU emulation of exactly this
// header (tests/kernels/cuda_emulation/kernels/cuda/ptx.cuh) runs the very kernel code on the CPU.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// lane = the thread's index in its warp, g = lane / 4 ("groupID"), t = lane % 4
// ("threadID_in_group"); a 32-bit register holds two 16-bit elements, the lower column (A, C) or
// row (B) in its low half:
//   A (16 x 16, row-major M x K), 4 registers:  a0 (g, 2t..2t+1)      a1 (g+8, 2t..2t+1)
//                                               a2 (g, 2t+8..2t+9)    a3 (g+8, 2t+8..2t+9)
//   B (16 x 8, K x N), 2 registers:             b0 (k 2t..2t+1, n g)  b1 (k 2t+8..2t+9, n g)
//   C, D (16 x 8, float), 4 registers:          c0, c1 (g, 2t..2t+1)  c2, c3 (g+8, 2t..2t+1)
// ldmatrix (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): matrix m of an x1/x2/x4
// load is 8 rows of 8 16-bit elements whose row addresses come from lanes 8m..8m+7 (16-byte
// aligned); register m of lane l receives row l / 4, columns 2(l % 4)..2(l % 4)+1 of matrix m, or
// with .trans column l / 4, rows 2(l % 4)..2(l % 4)+1.
//
// Requires sm_80 or newer (mma.sync bf16, ldmatrix, cp.async); sm_90 runs the same code.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/half.h"

namespace packsched::kernels::internal::cuda::ptx {

// The block's dynamic shared memory (16-byte aligned).
__device__ inline unsigned char* DynamicSmem() {
  extern __shared__ __align__(16) unsigned char packsched_dynamic_smem[];
  return packsched_dynamic_smem;
}

__device__ inline uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// d += a * b for one 16 x 8 x 16 tile of the warp (T = Bf16 or Fp16).
template <typename T>
__device__ inline void Mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ inline void Mma<Bf16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ inline void Mma<Fp16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ldmatrix: `row` is this lane's row address (see the header comment for which lanes count).
__device__ inline void Ldmatrix(uint32_t& r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r)
               : "r"(SmemAddress(row)));
}
__device__ inline void Ldmatrix(uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SmemAddress(row)));
}
__device__ inline void Ldmatrix(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(row)));
}
__device__ inline void LdmatrixTrans(uint32_t& r, const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r)
               : "r"(SmemAddress(row)));
}
__device__ inline void LdmatrixTrans(uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(SmemAddress(row)));
}
__device__ inline void LdmatrixTrans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(row)));
}

// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned) asynchronously; with
// `fill` false writes 16 zero bytes instead and reads nothing (src must still be a valid address).
__device__ inline void CpAsync16(void* dst, const void* src, bool fill) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddress(dst)), "l"(src),
               "r"(fill ? 16 : 0));
}
// Closes the group of this thread's copies issued since the last commit.
__device__ inline void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ inline void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// 16 bytes of global memory (16-byte aligned, not written while the kernel runs) through the
// read-only path, as 4 registers.
__device__ inline void LoadGlobal16(uint32_t (&r)[4], const void* p) {
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "l"(p));
}

// Warp shuffles over the full warp (every lane must call them).
template <typename V>
__device__ inline V ShflXor(V v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
template <typename V>
__device__ inline V Shfl(V v, int src_lane) {
  return __shfl_sync(0xffffffffu, v, src_lane);
}

// 2^x by the special function unit (ex2.approx.ftz.f32: relative error at most 2^-22 in the PTX
// ISA; a subnormal input counts as 0 and a subnormal result is flushed to 0; 2^-inf = +0). One
// instruction, where exp2f() adds the steps that keep subnormal results.
__device__ inline float Ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// Whether `p` holds in any lane of the warp (vote.any over the full warp; every lane must call).
__device__ inline bool WarpAny(bool p) { return __any_sync(0xffffffffu, p); }

// Two floats rounded to nearest-even into one register of T (Bf16 or Fp16): lo in the low half.
template <typename T>
__device__ inline uint32_t PackPair(float lo, float hi);

template <>
__device__ inline uint32_t PackPair<Bf16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ inline uint32_t PackPair<Fp16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

}  // namespace packsched::kernels::internal::cuda::ptx

#endif  // PACKSCHED_KERNELS_CUDA_PTX_CUH_
