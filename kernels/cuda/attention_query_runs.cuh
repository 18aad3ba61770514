#ifndef PACKSCHED_KERNELS_CUDA_ATTENTION_QUERY_RUNS_CUH_
#define PACKSCHED_KERNELS_CUDA_ATTENTION_QUERY_RUNS_CUH_

// The query-row map (attention.h: AttentionSeqlens::query_rows) on the CUDA attention: the host
// cuts the map into runs of consecutive rows (QueryRunsOf) and hands them to the kernels as
// AttentionArgs::query_runs; every kernel asks ListedRows whether a tile holds a mapped row. The
// forward and pass 1 (dq) skip a query tile without one (its block exits at once) and compute a
// tile with one whole, as without the map, so a mapped row's results are bitwise the call's
// without it; pass 2 (dk, dv) walks only query tiles with a mapped row and gives the others'
// rows no share (their lse read as +inf and D as 0: P = 0). AttentionBlankRowsKernel then writes
// every row outside the map as a query that sees no key (out 0 and lse +inf, or dq 0), over
// whatever the partial tiles wrote there.

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/internal/attention_args.h"

namespace packsched::kernels::internal::cuda {

// Host side: the runs of `n` strictly ascending rows as [first, end) pairs, ascending and
// separated by at least one row: {first0, end0, first1, end1, ...}.
inline std::vector<int32_t> QueryRunsOf(const int32_t* rows, int64_t n) {
  std::vector<int32_t> runs;
  for (int64_t i = 0; i < n; ++i) {
    if (runs.empty() || runs.back() != rows[i]) {
      runs.push_back(rows[i]);
      runs.push_back(rows[i] + 1);
    } else {
      ++runs.back();
    }
  }
  return runs;
}

// Whether packed query rows [lo, hi) hold a mapped row: true without a map. A binary search for
// the first run ending past lo.
__device__ inline bool ListedRows(const AttentionArgs& a, int64_t lo, int64_t hi) {
  if (a.query_runs == nullptr) return true;
  if (hi <= lo) return false;
  int64_t first = 0, count = a.num_query_runs;
  while (count > 0) {
    const int64_t step = count / 2;
    if (a.query_runs[2 * (first + step) + 1] <= lo) {
      first += step + 1;
      count -= step + 1;
    } else {
      count = step;
    }
  }
  return first < a.num_query_runs && a.query_runs[2 * first] < hi;
}

// Threads of a block of AttentionBlankRowsKernel.
inline constexpr int kBlankRowsThreads = 128;

// Writes every packed query row outside the map (a.query_runs) as a query that sees no key:
// `rows` [total_q, heads, head_dim] (out or dq) to 0, written as `Word`s (uint16_t: the elements
// of every dtype are whole 16-bit words, aligned), and when not null `lse` [heads, total_q] to
// +inf. One block per row, grid-stride.
template <typename Word>
__global__ void __launch_bounds__(kBlankRowsThreads)
    AttentionBlankRowsKernel(const AttentionArgs a, void* rows, float* lse) {
  const int64_t bytes = a.dtype == FloatType::kF32 ? 4 : 2;
  const int64_t words = a.heads * a.head_dim * bytes / static_cast<int64_t>(sizeof(Word));
  for (int64_t row = blockIdx.x; row < a.total_q; row += gridDim.x) {
    if (ListedRows(a, row, row + 1)) continue;
    Word* dst = static_cast<Word*>(rows) + row * words;
    for (int64_t i = threadIdx.x; i < words; i += kBlankRowsThreads) dst[i] = 0;
    if (lse == nullptr) continue;
    for (int64_t h = threadIdx.x; h < a.heads; h += kBlankRowsThreads) {
      lse[h * a.total_q + row] = INFINITY;
    }
  }
}

// Host side: the grid of AttentionBlankRowsKernel for `a` (at least one block).
inline dim3 BlankRowsGrid(const AttentionArgs& a) {
  const int64_t blocks = a.total_q < 4096 ? a.total_q : 4096;
  return dim3(static_cast<unsigned>(blocks < 1 ? 1 : blocks));
}

}  // namespace packsched::kernels::internal::cuda

#endif  // PACKSCHED_KERNELS_CUDA_ATTENTION_QUERY_RUNS_CUH_
