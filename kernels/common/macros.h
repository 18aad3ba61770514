#ifndef PACKSCHED_KERNELS_COMMON_MACROS_H_
#define PACKSCHED_KERNELS_COMMON_MACROS_H_

// PACKSCHED_HD marks a function as callable from host and device code. Under nvcc it expands to
// __host__ __device__; in plain C++ translation units it is empty, so the CPU backend compiles
// the very same arithmetic the CUDA backend runs.
#if defined(__CUDACC__)
#define PACKSCHED_HD __host__ __device__
#else
#define PACKSCHED_HD
#endif

#define PACKSCHED_HD_INLINE PACKSCHED_HD inline

#endif  // PACKSCHED_KERNELS_COMMON_MACROS_H_
