// The CUDA backend: every kernel of the API in one translation unit, with few instantiations
// (the copy kernels by vector width only, the arithmetic kernels by dtype x label type).
//
// Copy kernels treat rows as arrays of vectors of W bytes (W = 16, 8, 4, 2 or 1, the widest that
// divides the row size and the base pointers), so a warp moves 512 contiguous bytes per step.
// Rows of at least 32 vectors get a warp each (the row's source is looked up once); shorter rows
// are copied element by element over the flattened output, so 1-D tensors stay coalesced too.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/common/context_parallel.h"
#include "kernels/common/elementwise.h"
#include "kernels/common/half.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/launch_result.cuh"
#include "kernels/internal/args.h"

namespace packsched::kernels::internal::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;

int64_t Blocks(int64_t work, int64_t per_block = kThreads) {
  const int64_t b = (work + per_block - 1) / per_block;
  return b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b);
}

LaunchResult LastError() { return ResultOf(cudaGetLastError()); }

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

// ---- Row maps: which input row an output row copies (-1: a pad slot, filled) ----

// Unpad: x_packed[r] = x.flat[indices[r]]. An index outside the input (only possible when the
// mask disagrees with cu_seqlens, which the CUDA backend does not check) yields a zero row
// instead of a wild read.
struct IndexMap {
  const int64_t* indices;
  int64_t rows_in;
  __device__ int64_t operator()(int64_t r) const {
    const int64_t i = indices[r];
    return i >= 0 && i < rows_in ? i : -1;
  }
};

// PackAligned: aligned row r is real token `off` of sequence b, or a pad slot (tail rows too).
struct AlignedFromPacked {
  const int32_t* cu;
  const int32_t* cu_padded;
  int64_t batch;
  __device__ int64_t operator()(int64_t r) const {
    if (InTail(cu_padded, batch, r)) return -1;
    const int64_t b = SegmentOf(cu_padded, batch, r);
    const int64_t off = r - cu_padded[b];
    return off < cu[b + 1] - cu[b] ? cu[b] + off : -1;
  }
};

// UnpackAligned: packed row r sits at the same offset of its aligned segment.
struct PackedFromAligned {
  const int32_t* cu;
  const int32_t* cu_padded;
  int64_t batch;
  __device__ int64_t operator()(int64_t r) const {
    const int64_t b = SegmentOf(cu, batch, r);
    return cu_padded[b] + (r - cu[b]);
  }
};

// out[r] = in[map(r)] (or `fill` for a pad slot), for `rows` rows of `vecs` vectors.
template <typename V, typename Map>
__global__ void GatherRows(const V* __restrict__ in, V* __restrict__ out, int64_t rows,
                           int64_t vecs, Map map, V fill) {
  if (vecs >= 32) {
    const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
    const int lane = threadIdx.x % 32;
    for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows;
         r += warps) {
      const int64_t src = map(r);
      V* dst = out + r * vecs;
      if (src < 0) {
        for (int64_t c = lane; c < vecs; c += 32) dst[c] = fill;
      } else {
        const V* from = in + src * vecs;
        for (int64_t c = lane; c < vecs; c += 32) dst[c] = from[c];
      }
    }
    return;
  }
  const int64_t n = rows * vecs;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / vecs;
    const int64_t src = map(r);
    out[e] = src < 0 ? fill : in[src * vecs + (e - r * vecs)];
  }
}

// x[indices[r]] = x_packed[r]; out-of-range indices are skipped (the CPU backend rejects them).
template <typename V>
__global__ void ScatterRows(const V* __restrict__ in, const int64_t* __restrict__ indices,
                            V* __restrict__ out, int64_t rows, int64_t vecs, int64_t rows_out) {
  const int64_t n = rows * vecs;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / vecs;
    const int64_t dst = indices[r];
    if (dst >= 0 && dst < rows_out) out[dst * vecs + (e - r * vecs)] = in[e];
  }
}

// The widest vector (bytes) that divides the row size and aligns every pointer.
int VectorWidth(int64_t row_bytes, int64_t min_width, const void* p0, const void* p1) {
  for (int w = 16; w > 1; w /= 2) {
    if (w < min_width) break;
    if (row_bytes % w == 0 && reinterpret_cast<uintptr_t>(p0) % w == 0 &&
        reinterpret_cast<uintptr_t>(p1) % w == 0) {
      return w;
    }
  }
  return static_cast<int>(min_width);
}

template <typename V, typename Map>
void LaunchGatherTyped(const void* in, void* out, int64_t rows, int64_t row_bytes, Map map,
                       const unsigned char* pattern, cudaStream_t stream) {
  const int64_t vecs = row_bytes / static_cast<int64_t>(sizeof(V));
  V fill{};
  if (pattern != nullptr) memcpy(&fill, pattern, sizeof(V));
  const int64_t threads_needed = vecs >= 32 ? rows * 32 : rows * vecs;
  GatherRows<V, Map><<<Blocks(threads_needed), kThreads, 0, stream>>>(
      static_cast<const V*>(in), static_cast<V*>(out), rows, vecs, map, fill);
}

template <typename Map>
LaunchResult LaunchGather(const void* in, void* out, int64_t rows, int64_t row_bytes,
                          int64_t min_width, Map map, const unsigned char* pattern,
                          cudaStream_t stream) {
  if (rows == 0 || row_bytes == 0) return ResultOf(cudaSuccess);
  switch (VectorWidth(row_bytes, min_width, in, out)) {
    case 16:
      LaunchGatherTyped<uint4>(in, out, rows, row_bytes, map, pattern, stream);
      break;
    case 8:
      LaunchGatherTyped<uint2>(in, out, rows, row_bytes, map, pattern, stream);
      break;
    case 4:
      LaunchGatherTyped<uint32_t>(in, out, rows, row_bytes, map, pattern, stream);
      break;
    case 2:
      LaunchGatherTyped<uint16_t>(in, out, rows, row_bytes, map, pattern, stream);
      break;
    default:
      LaunchGatherTyped<uint8_t>(in, out, rows, row_bytes, map, pattern, stream);
  }
  return LastError();
}

// ---- Unpad: indices from the mask ----

// One block per batch row: ranks the row's tokens with warp ballots and writes their flat
// indices to indices[cu[b] + rank]. Tokens beyond the row's cu_seqlens length are dropped.
__global__ void MaskToIndices(const void* __restrict__ mask, int mask_bytes,
                              const int32_t* __restrict__ cu, int64_t batch, int64_t seqlen,
                              int64_t* __restrict__ indices) {
  __shared__ int warp_counts[kThreads / 32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const int64_t start = cu[b];
    const int64_t len = cu[b + 1] - start;
    int64_t base = 0;  // tokens of this row seen in earlier chunks
    for (int64_t s0 = 0; s0 < seqlen && base < len; s0 += kThreads) {
      const int64_t s = s0 + threadIdx.x;
      bool token = false;
      if (s < seqlen) {
        const int64_t i = b * seqlen + s;
        token = mask_bytes == 1   ? static_cast<const uint8_t*>(mask)[i] != 0
                : mask_bytes == 4 ? static_cast<const int32_t*>(mask)[i] != 0
                                  : static_cast<const int64_t*>(mask)[i] != 0;
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, token);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int before = 0;  // tokens in earlier warps of this chunk
      int chunk = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        before += w < warp ? warp_counts[w] : 0;
        chunk += warp_counts[w];
      }
      const int64_t rank = base + before + __popc(ballot & ((1u << lane) - 1u));
      if (token && rank < len) indices[start + rank] = b * seqlen + s;
      base += chunk;
      __syncthreads();  // warp_counts is rewritten by the next chunk
    }
  }
}

// ---- PackAligned: padded offsets ----

// One block: cu_padded = exclusive scan of AlignUp(len_b, align); seqused = len_b. Each thread
// sums a contiguous chunk, the block scans the chunk sums, each thread then writes its chunk.
__global__ void AlignedOffsets(const int32_t* __restrict__ cu, int64_t batch, int64_t align,
                               int32_t* __restrict__ cu_padded, int32_t* __restrict__ seqused) {
  __shared__ int64_t sums[kThreads];
  const int64_t per_thread = (batch + kThreads - 1) / kThreads;
  const int64_t lo = threadIdx.x * per_thread;
  const int64_t hi = lo + per_thread < batch ? lo + per_thread : batch;
  int64_t local = 0;
  for (int64_t b = lo; b < hi; ++b) local += AlignUp(cu[b + 1] - cu[b], align);
  sums[threadIdx.x] = local;
  __syncthreads();
  // Inclusive Hillis-Steele scan over the chunk sums.
  for (int step = 1; step < kThreads; step *= 2) {
    const int64_t add = threadIdx.x >= step ? sums[threadIdx.x - step] : 0;
    __syncthreads();
    sums[threadIdx.x] += add;
    __syncthreads();
  }
  int64_t offset = sums[threadIdx.x] - local;
  if (threadIdx.x == 0) cu_padded[0] = 0;
  for (int64_t b = lo; b < hi; ++b) {
    const int64_t len = cu[b + 1] - cu[b];
    offset += AlignUp(len, align);
    cu_padded[b + 1] = static_cast<int32_t>(offset);
    seqused[b] = static_cast<int32_t>(len);
  }
}

// ---- Positions and labels ----

__global__ void PositionIdsKernel(const int32_t* __restrict__ cu, int64_t batch, int64_t rows,
                                  int64_t* __restrict__ pos) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    pos[t] = PositionId(t, SegmentStart(cu, batch, t));
  }
}

template <typename Id>
__global__ void ShiftLabelsKernel(const Id* __restrict__ ids, const int32_t* __restrict__ cu,
                                  const int32_t* __restrict__ layout, int64_t batch, int64_t rows,
                                  Id ignore, Id* __restrict__ labels) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (InTail(layout, batch, t)) {  // a segment without real tokens
      labels[t] = ShiftedLabel<Id>(ids, t, layout[batch], /*real_len=*/0, ignore);
      continue;
    }
    const int64_t b = SegmentOf(layout, batch, t);
    labels[t] = ShiftedLabel<Id>(ids, t, layout[b], cu[b + 1] - cu[b], ignore);
  }
}

// ---- Cross entropy ----

template <typename AccT>
__device__ LogSumExp<AccT> WarpCombine(LogSumExp<AccT> s) {
  for (int offset = 16; offset > 0; offset /= 2) {
    LogSumExp<AccT> other;
    other.max = __shfl_xor_sync(0xffffffffu, s.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, s.sum, offset);
    s = LseCombine(s, other);
  }
  return s;
}

// One block per row (grid-stride): each thread folds a strided slice of the row into a running
// log-sum-exp (16-byte loads when the row is aligned), then warps and the block combine.
template <typename T, typename Label>
__global__ void CrossEntropyRows(const T* __restrict__ logits, int64_t vocab,
                                 const Label* __restrict__ labels, int64_t rows,
                                 const int32_t* __restrict__ cu, int64_t batch,
                                 int64_t ignore_index, T* __restrict__ loss) {
  using AccT = Acc<T>;
  constexpr int kPerVec = 16 / sizeof(T);
  __shared__ AccT warp_max[kThreads / 32];
  __shared__ AccT warp_sum[kThreads / 32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    if (InTail(cu, batch, t)) {  // tail rows: loss 0, labels not read (uniform across the block)
      if (threadIdx.x == 0) loss[t] = FromAcc<T>(AccT(0));
      continue;
    }
    const int64_t label = labels[t];
    if (label == ignore_index) {  // uniform across the block
      if (threadIdx.x == 0) loss[t] = FromAcc<T>(AccT(0));
      continue;
    }
    const T* row = logits + t * vocab;
    LogSumExp<AccT> s = LseEmpty<AccT>();
    if (vocab % kPerVec == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0) {
      const uint4* vec = reinterpret_cast<const uint4*>(row);
      for (int64_t i = threadIdx.x; i < vocab / kPerVec; i += blockDim.x) {
        const uint4 chunk = vec[i];
        const T* elems = reinterpret_cast<const T*>(&chunk);
#pragma unroll
        for (int j = 0; j < kPerVec; ++j) LseAdd(s, ToAcc(elems[j]));
      }
    } else {
      for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) LseAdd(s, ToAcc(row[v]));
    }
    s = WarpCombine(s);
    if (lane == 0) {
      warp_max[warp] = s.max;
      warp_sum[warp] = s.sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      LogSumExp<AccT> all = LseEmpty<AccT>();
      for (int w = 0; w < kThreads / 32; ++w) {
        all = LseCombine(all, LogSumExp<AccT>{warp_max[w], warp_sum[w]});
      }
      const AccT value = label >= 0 && label < vocab ? CrossEntropy(all, ToAcc(row[label]))
                                                     : static_cast<AccT>(NAN);
      loss[t] = FromAcc<T>(value);
    }
    __syncthreads();  // warp_max/warp_sum are rewritten by the next row
  }
}

// One block per sequence: sums its stored per-token losses and counts its non-ignored labels.
template <typename T, typename Label>
__global__ void CrossEntropySequences(const T* __restrict__ loss, const Label* __restrict__ labels,
                                      const int32_t* __restrict__ cu, int64_t batch,
                                      int64_t ignore_index, T* __restrict__ seq_sum,
                                      int64_t* __restrict__ seq_count) {
  using AccT = Acc<T>;
  __shared__ AccT sums[kThreads];
  __shared__ int64_t counts[kThreads];
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    AccT sum = 0;
    int64_t count = 0;
    for (int64_t t = cu[b] + threadIdx.x; t < cu[b + 1]; t += blockDim.x) {
      sum += ToAcc(loss[t]);
      count += labels[t] != ignore_index;
    }
    sums[threadIdx.x] = sum;
    counts[threadIdx.x] = count;
    __syncthreads();
    for (int step = kThreads / 2; step > 0; step /= 2) {
      if (threadIdx.x < step) {
        sums[threadIdx.x] += sums[threadIdx.x + step];
        counts[threadIdx.x] += counts[threadIdx.x + step];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      seq_sum[b] = FromAcc<T>(sums[0]);
      seq_count[b] = counts[0];
    }
    __syncthreads();
  }
}

template <typename T, typename Label>
void LaunchCrossEntropyTyped(const CrossEntropyArgs& a, cudaStream_t stream) {
  const T* logits = static_cast<const T*>(a.logits);
  const Label* labels = static_cast<const Label*>(a.labels);
  T* loss = static_cast<T*>(a.per_token_loss);
  if (a.rows > 0) {
    CrossEntropyRows<T, Label><<<Blocks(a.rows, 1), kThreads, 0, stream>>>(
        logits, a.vocab, labels, a.rows, a.cu, a.batch, a.ignore_index, loss);
  }
  if (a.batch > 0) {
    CrossEntropySequences<T, Label><<<Blocks(a.batch, 1), kThreads, 0, stream>>>(
        loss, labels, a.cu, a.batch, a.ignore_index, static_cast<T*>(a.per_sequence_sum),
        a.per_sequence_count);
  }
}

template <typename Label>
void LaunchCrossEntropyByDtype(const CrossEntropyArgs& a, cudaStream_t stream) {
  switch (a.dtype) {
    case FloatType::kF16:
      return LaunchCrossEntropyTyped<Fp16, Label>(a, stream);
    case FloatType::kBf16:
      return LaunchCrossEntropyTyped<Bf16, Label>(a, stream);
    case FloatType::kF32:
      return LaunchCrossEntropyTyped<float, Label>(a, stream);
    case FloatType::kF64:
      return LaunchCrossEntropyTyped<double, Label>(a, stream);
  }
}

// ---- Context parallelism and 3-D positions ----

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

LaunchResult LaunchUnpad(const UnpadArgs& a, void* stream) {
  if (a.total == 0) return ResultOf(cudaSuccess);
  MaskToIndices<<<Blocks(a.batch, 1), kThreads, 0, AsStream(stream)>>>(
      a.mask, a.mask_bytes, a.cu, a.batch, a.seqlen, a.indices);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return ResultOf(e);
  return LaunchGather(a.x, a.x_packed, a.total, a.row_bytes, 1,
                      IndexMap{a.indices, a.batch * a.seqlen}, nullptr, AsStream(stream));
}

LaunchResult LaunchPad(const PadArgs& a, void* stream) {
  const int64_t bytes = a.rows_out * a.row_bytes;
  if (bytes == 0) return ResultOf(cudaSuccess);
  if (cudaError_t e = cudaMemsetAsync(a.x, 0, bytes, AsStream(stream)); e != cudaSuccess) {
    return ResultOf(e);
  }
  if (a.total == 0) return ResultOf(cudaSuccess);
  const int w = VectorWidth(a.row_bytes, 1, a.x_packed, a.x);
  const int64_t vecs = a.row_bytes / w;
  const int64_t blocks = Blocks(a.total * vecs);
  switch (w) {
#define PACKSCHED_SCATTER_CASE(W, V)                                                             \
  case W:                                                                                        \
    ScatterRows<V><<<blocks, kThreads, 0, AsStream(stream)>>>(static_cast<const V*>(a.x_packed), \
                                                              a.indices, static_cast<V*>(a.x),   \
                                                              a.total, vecs, a.rows_out);        \
    break;
    PACKSCHED_SCATTER_CASE(16, uint4)
    PACKSCHED_SCATTER_CASE(8, uint2)
    PACKSCHED_SCATTER_CASE(4, uint32_t)
    PACKSCHED_SCATTER_CASE(2, uint16_t)
    PACKSCHED_SCATTER_CASE(1, uint8_t)
#undef PACKSCHED_SCATTER_CASE
  }
  return LastError();
}

LaunchResult LaunchPackAligned(const PackAlignedArgs& a, void* stream) {
  if (a.batch == 0) {
    // cu_seqlens_padded = {0}, then only the tail (if any) to fill.
    const cudaError_t e = cudaMemsetAsync(a.cu_padded, 0, sizeof(int32_t), AsStream(stream));
    if (e != cudaSuccess || a.rows == 0) return ResultOf(e);
  } else {
    AlignedOffsets<<<1, kThreads, 0, AsStream(stream)>>>(a.cu, a.batch, a.align, a.cu_padded,
                                                         a.seqused);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return ResultOf(e);
  }
  // The gather reads the offsets just written, in stream order; tail rows map to the pad value.
  return LaunchGather(a.x_packed, a.x_aligned, a.rows, a.row_bytes, a.elem_bytes,
                      AlignedFromPacked{a.cu, a.cu_padded, a.batch}, a.pad_pattern,
                      AsStream(stream));
}

LaunchResult LaunchUnpackAligned(const UnpackAlignedArgs& a, void* stream) {
  return LaunchGather(a.x_aligned, a.x_packed, a.total, a.row_bytes, 1,
                      PackedFromAligned{a.cu, a.cu_padded, a.batch}, nullptr, AsStream(stream));
}

LaunchResult LaunchPositionIds(const PositionIdsArgs& a, void* stream) {
  if (a.rows == 0) return ResultOf(cudaSuccess);
  PositionIdsKernel<<<Blocks(a.rows), kThreads, 0, AsStream(stream)>>>(a.cu, a.batch, a.rows,
                                                                       a.position_ids);
  return LastError();
}

LaunchResult LaunchShiftLabels(const ShiftLabelsArgs& a, void* stream) {
  if (a.rows == 0) return ResultOf(cudaSuccess);
  const int32_t* layout = a.cu_padded != nullptr ? a.cu_padded : a.cu;
  if (a.ids_64) {
    ShiftLabelsKernel<int64_t><<<Blocks(a.rows), kThreads, 0, AsStream(stream)>>>(
        static_cast<const int64_t*>(a.ids), a.cu, layout, a.batch, a.rows, a.ignore_index,
        static_cast<int64_t*>(a.labels));
  } else {
    ShiftLabelsKernel<int32_t><<<Blocks(a.rows), kThreads, 0, AsStream(stream)>>>(
        static_cast<const int32_t*>(a.ids), a.cu, layout, a.batch, a.rows,
        static_cast<int32_t>(a.ignore_index), static_cast<int32_t*>(a.labels));
  }
  return LastError();
}

LaunchResult LaunchPackedCrossEntropy(const CrossEntropyArgs& a, void* stream) {
  if (a.rows == 0 && a.batch == 0) return ResultOf(cudaSuccess);
  if (a.labels_64) {
    LaunchCrossEntropyByDtype<int64_t>(a, AsStream(stream));
  } else {
    LaunchCrossEntropyByDtype<int32_t>(a, AsStream(stream));
  }
  return LastError();
}

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
