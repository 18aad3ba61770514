#ifndef PACKSCHED_KERNELS_COMMON_CONTEXT_PARALLEL_H_
#define PACKSCHED_KERNELS_COMMON_CONTEXT_PARALLEL_H_

// Per-row math of context parallelism (CP) and of 3-D rotary positions, compiled for host and
// device (see elementwise.h): both backends call these functions, so the CPU backend is the
// CUDA backend's reference by construction.
//
// Head-tail layout: every sequence of an aligned micro-batch (offsets `cu`, each length a
// multiple of 2 * cp) is cut into 2 * cp chunks of len / (2 * cp) rows; CP rank c holds chunk c
// and chunk 2 * cp - 1 - c of every sequence, in sequence order. Its shard therefore has
// cu[B] / cp rows, sequence b in local rows [cu[b] / cp, cu[b + 1] / cp). Under causal attention
// chunk c's queries see (c + 1/2) chunks of keys on average and chunk 2cp-1-c's see
// (2cp - c - 1/2): every rank gets the same work, cp chunks' worth, for every sequence.

#include <cstdint>

#include "kernels/common/macros.h"

namespace packsched::kernels {

// The row of the full micro-batch that row `r` of CP rank `rank`'s shard holds.
// REQUIRES: batch >= 1, 1 <= cp, 0 <= rank < cp, every cu[b + 1] - cu[b] a multiple of 2 * cp,
// 0 <= r < cu[batch] / cp.
PACKSCHED_HD_INLINE int64_t CpSourceRow(const int32_t* cu, int64_t batch, int64_t cp, int64_t rank,
                                        int64_t r) {
  // The first j in [1, batch] with cu[j] / cp > r (local offsets are the global ones / cp).
  int64_t lo = 1;
  int64_t hi = batch;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (cu[mid] / cp > r) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const int64_t b = lo - 1;
  const int64_t chunk = (cu[b + 1] - cu[b]) / (2 * cp);
  const int64_t j = r - cu[b] / cp;  // row within the sequence's part of the shard
  return cu[b] + (j < chunk ? rank * chunk + j : (2 * cp - 1 - rank) * chunk + (j - chunk));
}

// 3-D rotary positions (Qwen2-VL "mrope") of one sequence of `len` rows: `types[t]` is 0 for a
// text token and nonzero for a vision token (image or video); each maximal block of vision tokens
// is consumed one grid at a time, grid g = (t, h, w) patches covering t * (h / merge) * (w / merge)
// tokens. A text token gets the same position p on all three rows, p = (the previous token's
// "next" position); a vision grid placed at next position s gives token k of the grid
// (s + k / (h' w'), s + (k / w') % h', s + k % w') with h' = h / merge, w' = w / merge, and the
// next position becomes s + max(t, h', w'). So a text-only sequence gets 0, 1, 2, ... on every row.
// Writes pos[row * stride + i] for row 0..2, i in [0, len) when `pos` is not null.
// Returns 0 on success, else (and then every unwritten position of the sequence is set to -1):
// 1 a grid is needed but `grids` is exhausted, 2 a grid runs past the sequence end, 3 a grid
// covers a text token, 4 a grid's h or w is not a positive multiple of merge or t < 1, 5 grids
// were left unused.
PACKSCHED_HD_INLINE int MropeSequence(const int32_t* types, int64_t len, const int32_t* grids,
                                      int64_t num_grids, int64_t merge, int64_t* pos,
                                      int64_t stride) {
  int64_t next = 0;
  int64_t g = 0;
  int64_t t = 0;
  int error = 0;
  while (t < len) {
    if (types[t] == 0) {
      if (pos != nullptr) {
        pos[t] = next;
        pos[stride + t] = next;
        pos[2 * stride + t] = next;
      }
      ++next;
      ++t;
      continue;
    }
    if (g >= num_grids) {
      error = 1;
      break;
    }
    const int64_t gt = grids[3 * g];
    const int64_t gh = grids[3 * g + 1];
    const int64_t gw = grids[3 * g + 2];
    if (gt < 1 || gh < merge || gw < merge || gh % merge != 0 || gw % merge != 0) {
      error = 4;
      break;
    }
    const int64_t h = gh / merge;
    const int64_t w = gw / merge;
    const int64_t n = gt * h * w;
    if (t + n > len) {
      error = 2;
      break;
    }
    for (int64_t k = 0; k < n; ++k) {
      if (types[t + k] == 0) error = 3;
    }
    if (error != 0) break;
    if (pos != nullptr) {
      for (int64_t k = 0; k < n; ++k) {
        pos[t + k] = next + k / (h * w);
        pos[stride + t + k] = next + (k / w) % h;
        pos[2 * stride + t + k] = next + k % w;
      }
    }
    const int64_t extent = gt > h ? (gt > w ? gt : w) : (h > w ? h : w);
    next += extent;
    t += n;
    ++g;
  }
  if (error == 0 && g != num_grids) error = 5;
  if (error != 0 && pos != nullptr) {
    for (int64_t i = (error == 5 ? len : t); i < len; ++i) {
      pos[i] = -1;
      pos[stride + i] = -1;
      pos[2 * stride + i] = -1;
    }
  }
  return error;
}

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_COMMON_CONTEXT_PARALLEL_H_
