#ifndef PACKSCHED_KERNELS_COMMON_ELEMENTWISE_H_
#define PACKSCHED_KERNELS_COMMON_ELEMENTWISE_H_

// Per-element math of the packing kernels, compiled for host and device. Both backends call these
// functions for every element, so the CPU backend is a reference for the CUDA backend by
// construction, not by imitation.
//
// Conventions: `cu` is a cu_seqlens array of `num_segments + 1` int32 offsets, cu[0] = 0,
// non-decreasing; row t belongs to segment b when cu[b] <= t < cu[b + 1].

#include <cmath>
#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/common/macros.h"

namespace packsched::kernels {

// Returns the segment that holds row `t` (zero-length segments hold no row, so they are never
// returned). REQUIRES: num_segments >= 1, 0 <= t < cu[num_segments].
PACKSCHED_HD_INLINE int64_t SegmentOf(const int32_t* cu, int64_t num_segments, int64_t t) {
  // The first j in [1, num_segments] with cu[j] > t; t lies in segment j - 1.
  int64_t lo = 1;
  int64_t hi = num_segments;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (cu[mid] > t) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo - 1;
}

// Rows [cu[num_segments], rows) of a buffer are its tail (kernels.h): the padding up to the plan's
// total rows, in no sequence. It acts as one more segment, starting at cu[num_segments], without
// real tokens: positions restart at 0 there, labels are ignore_index, losses 0.
PACKSCHED_HD_INLINE bool InTail(const int32_t* cu, int64_t num_segments, int64_t t) {
  return t >= cu[num_segments];
}

// Start of the segment that holds row `t`, the tail counting as one.
// REQUIRES: num_segments >= 0, t >= 0.
PACKSCHED_HD_INLINE int64_t SegmentStart(const int32_t* cu, int64_t num_segments, int64_t t) {
  return InTail(cu, num_segments, t) ? cu[num_segments] : cu[SegmentOf(cu, num_segments, t)];
}

// Smallest multiple of `align` that is >= `len`. REQUIRES: len >= 0, align >= 1.
PACKSCHED_HD_INLINE int64_t AlignUp(int64_t len, int64_t align) {
  return (len + align - 1) / align * align;
}

// pos[t] = t - start of t's segment. With padded offsets the pad slots after a sequence's real
// tokens continue the count, so a position is never reset inside a segment; the tail restarts
// at 0 (pass SegmentStart).
PACKSCHED_HD_INLINE int64_t PositionId(int64_t t, int64_t segment_start) {
  return t - segment_start;
}

// The label of row t: the next token of the same sequence, or `ignore_index` at the sequence's
// last real token and on every pad slot. `segment_start` is where t's segment starts in `ids`,
// `real_len` how many of its rows are real tokens (the rest are pads).
template <typename Id>
PACKSCHED_HD_INLINE Id ShiftedLabel(const Id* ids, int64_t t, int64_t segment_start,
                                    int64_t real_len, Id ignore_index) {
  return t - segment_start + 1 < real_len ? ids[t + 1] : ignore_index;
}

PACKSCHED_HD_INLINE float Exp(float x) { return expf(x); }
PACKSCHED_HD_INLINE double Exp(double x) { return exp(x); }
PACKSCHED_HD_INLINE float Log(float x) { return logf(x); }
PACKSCHED_HD_INLINE double Log(double x) { return log(x); }

// A running log-sum-exp: log(sum_i exp(x_i)) = max + log(sum), with sum = sum_i exp(x_i - max).
// Elements are added one at a time (online softmax) and partial states combine associatively,
// so a thread can fold a strided slice and a block can then merge the threads' states.
template <typename AccT>
struct LogSumExp {
  AccT max;
  AccT sum;
};

template <typename AccT>
PACKSCHED_HD_INLINE LogSumExp<AccT> LseEmpty() {
  return LogSumExp<AccT>{-static_cast<AccT>(INFINITY), AccT(0)};
}

template <typename AccT>
PACKSCHED_HD_INLINE void LseAdd(LogSumExp<AccT>& s, AccT x) {
  if (x > s.max) {
    s.sum = s.sum * Exp(s.max - x) + AccT(1);  // rescale the old sum to the new max
    s.max = x;
  } else if (x !=
             -static_cast<AccT>(INFINITY)) {  // exp(-inf) adds nothing (and -inf - -inf is NaN)
    s.sum += Exp(x - s.max);                  // a NaN x falls through here and poisons sum
  }
}

template <typename AccT>
PACKSCHED_HD_INLINE LogSumExp<AccT> LseCombine(LogSumExp<AccT> a, LogSumExp<AccT> b) {
  if (b.max == -static_cast<AccT>(INFINITY) && b.sum == AccT(0)) return a;
  if (a.max == -static_cast<AccT>(INFINITY) && a.sum == AccT(0)) return b;
  const AccT m = a.max > b.max ? a.max : b.max;
  return LogSumExp<AccT>{m, a.sum * Exp(a.max - m) + b.sum * Exp(b.max - m)};
}

template <typename AccT>
PACKSCHED_HD_INLINE AccT LseValue(LogSumExp<AccT> s) {
  return s.max + Log(s.sum);
}

// Cross entropy of one token: -log softmax(logits)[label] = logsumexp(logits) - logits[label].
template <typename AccT>
PACKSCHED_HD_INLINE AccT CrossEntropy(LogSumExp<AccT> lse, AccT label_logit) {
  return LseValue(lse) - label_logit;
}

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_COMMON_ELEMENTWISE_H_
