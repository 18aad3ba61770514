// The CUDA context parallelism (head-tail CpShard / CpUnshard) and 3-D rotary position ids.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/context_parallel.h"
#include "kernels/common/elementwise.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/cuda/row_copy.cuh"
#include "kernels/internal/args.h"

namespace packsched::kernels::internal::cuda {
namespace {

// CpShard / CpUnshard: shard row r of a CP rank is row CpSourceRow(r) of the full micro-batch.
struct CpMap {
  const int32_t* cu;
  int64_t batch, cp, rank;
  __device__ int64_t operator()(int64_t r) const { return CpSourceRow(cu, batch, cp, rank, r); }
};

// out[map(r)] = in[r], for `rows` rows of `vecs` vectors (map is injective: no two rows collide).
template <typename V, typename Map>
__global__ void ScatterRowsMapped(const V* __restrict__ in, V* __restrict__ out, int64_t rows,
                                  int64_t vecs, Map map) {
  const int64_t n = rows * vecs;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / vecs;
    out[map(r) * vecs + (e - r * vecs)] = in[e];
  }
}

// One thread per sequence (thread `batch` writes the tail): each scans its sequence in order,
// since a vision grid's positions depend on every token before it. Simple, not fast: a sequence
// of L tokens is L serial steps.
__global__ void MropeKernel(const int32_t* __restrict__ types, const int32_t* __restrict__ cu,
                            const int32_t* __restrict__ grids, const int32_t* __restrict__ grid_cu,
                            int64_t batch, int64_t rows, int64_t merge, int64_t* __restrict__ pos) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < batch) {
    MropeSequence(types + cu[b], cu[b + 1] - cu[b], grids + 3 * static_cast<int64_t>(grid_cu[b]),
                  grid_cu[b + 1] - grid_cu[b], merge, pos + cu[b], rows);
  } else if (b == batch) {
    for (int64_t t = cu[batch]; t < rows; ++t) {
      const int64_t p = PositionId(t, cu[batch]);
      pos[t] = p;
      pos[rows + t] = p;
      pos[2 * rows + t] = p;
    }
  }
}

}  // namespace

LaunchResult LaunchCpShard(const CpShardArgs& a, void* stream) {
  if (a.total == 0) return ResultOf(cudaSuccess);
  return LaunchGather(a.x, a.shard, a.total / a.cp, a.row_bytes, 1,
                      CpMap{a.cu, a.batch, a.cp, a.rank}, nullptr, AsStream(stream));
}

LaunchResult LaunchCpUnshard(const CpShardArgs& a, void* stream) {
  const int64_t rows = a.total / a.cp;
  if (rows == 0 || a.row_bytes == 0) return ResultOf(cudaSuccess);
  const int w = VectorWidth(a.row_bytes, 1, a.shard, a.x);
  const int64_t vecs = a.row_bytes / w;
  const int64_t blocks = Blocks(rows * vecs);
  const CpMap map{a.cu, a.batch, a.cp, a.rank};
  switch (w) {
#define PACKSCHED_CP_SCATTER_CASE(W, V)                                         \
  case W:                                                                       \
    ScatterRowsMapped<V, CpMap><<<blocks, kThreads, 0, AsStream(stream)>>>(     \
        static_cast<const V*>(a.shard), static_cast<V*>(a.x), rows, vecs, map); \
    break;
    PACKSCHED_CP_SCATTER_CASE(16, uint4)
    PACKSCHED_CP_SCATTER_CASE(8, uint2)
    PACKSCHED_CP_SCATTER_CASE(4, uint32_t)
    PACKSCHED_CP_SCATTER_CASE(2, uint16_t)
    PACKSCHED_CP_SCATTER_CASE(1, uint8_t)
#undef PACKSCHED_CP_SCATTER_CASE
  }
  return LastError();
}

LaunchResult LaunchMropePositionIds(const MropeArgs& a, void* stream) {
  if (a.rows == 0) return ResultOf(cudaSuccess);
  MropeKernel<<<Blocks(a.batch + 1), kThreads, 0, AsStream(stream)>>>(
      a.types, a.cu, a.grids, a.grid_cu, a.batch, a.rows, a.merge, a.position_ids);
  return LastError();
}

}  // namespace packsched::kernels::internal::cuda
