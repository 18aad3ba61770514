// The CPU backend of the tree-packing kernels (tree.h): depths from subtree_end with one stack per
// sequence, and the multi-target cross entropy row by row. Per-element math in common/tree.h and
// common/elementwise.h, shared with the CUDA backend.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/elementwise.h"
#include "kernels/common/half.h"
#include "kernels/common/tree.h"
#include "kernels/internal/backend.h"

namespace packsched::kernels::internal::cpu {
namespace {

template <typename Index>
absl::Status CheckTargetValues(const MultiTargetArgs& a) {
  const Index* rows = static_cast<const Index*>(a.rows);
  const Index* labels = static_cast<const Index*>(a.labels);
  for (int64_t i = 0; i < a.targets; ++i) {
    if (rows[i] < 0 || rows[i] >= a.num_rows || (i > 0 && rows[i] < rows[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("MultiTargetCrossEntropy: rows[", i, "] = ", rows[i], " is outside [",
                       i > 0 ? static_cast<int64_t>(rows[i - 1]) : 0, ", ", a.num_rows,
                       ") (rows must be non-decreasing row indices of logits)"));
    }
    if (labels[i] < 0 || labels[i] >= a.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("MultiTargetCrossEntropy: labels[", i, "] = ",
                                                     labels[i], " is outside [0, ", a.vocab, ")"));
    }
  }
  return absl::OkStatus();
}

template <typename T, typename Index>
void Forward(const MultiTargetArgs& a) {
  using AccT = Acc<T>;
  const T* logits = static_cast<const T*>(a.logits);
  AccT* lse = static_cast<AccT*>(a.row_lse);
  for (int64_t r = 0; r < a.num_rows; ++r) {
    LogSumExp<AccT> s = LseEmpty<AccT>();
    for (int64_t v = 0; v < a.vocab; ++v) LseAdd(s, ToAcc(logits[r * a.vocab + v]));
    lse[r] = LseValue(s);
  }
  const Index* rows = static_cast<const Index*>(a.rows);
  const Index* labels = static_cast<const Index*>(a.labels);
  AccT* loss = static_cast<AccT*>(a.loss);
  for (int64_t i = 0; i < a.targets; ++i) {
    loss[i] = lse[rows[i]] - ToAcc(logits[rows[i] * a.vocab + labels[i]]);
  }
}

template <typename T, typename Index>
void Backward(const MultiTargetArgs& a) {
  using AccT = Acc<T>;
  const T* logits = static_cast<const T*>(a.logits);
  const AccT* lse = static_cast<const AccT*>(a.row_lse);
  const AccT* d_loss = static_cast<const AccT*>(a.d_loss);
  const Index* rows = static_cast<const Index*>(a.rows);
  const Index* labels = static_cast<const Index*>(a.labels);
  T* d_logits = static_cast<T*>(a.d_logits);
  std::vector<AccT> grad(a.vocab);
  for (int64_t r = 0; r < a.num_rows; ++r) {
    const int64_t lo = LowerBound(rows, 0, a.targets, r);
    const int64_t hi = LowerBound(rows, lo, a.targets, r + 1);
    AccT sum = 0;
    for (int64_t i = lo; i < hi; ++i) sum += d_loss[i];
    for (int64_t v = 0; v < a.vocab; ++v) {
      grad[v] = MultiTargetSoftmaxGrad(sum, ToAcc(logits[r * a.vocab + v]), lse[r]);
    }
    for (int64_t i = lo; i < hi; ++i) grad[labels[i]] -= d_loss[i];
    for (int64_t v = 0; v < a.vocab; ++v) d_logits[r * a.vocab + v] = FromAcc<T>(grad[v]);
  }
}

template <template <typename, typename> class Fn>
void ByTypes(const MultiTargetArgs& a) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (a.index_64) {
      Fn<T, int64_t>::Run(a);
    } else {
      Fn<T, int32_t>::Run(a);
    }
  };
  switch (a.dtype) {
    case FloatType::kF16:
      return run(Fp16{});
    case FloatType::kBf16:
      return run(Bf16{});
    case FloatType::kF32:
      return run(float{});
    case FloatType::kF64:
      return run(double{});
  }
}

template <typename T, typename Index>
struct RunForward {
  static void Run(const MultiTargetArgs& a) { Forward<T, Index>(a); }
};
template <typename T, typename Index>
struct RunBackward {
  static void Run(const MultiTargetArgs& a) { Backward<T, Index>(a); }
};

absl::Status CheckValues(const MultiTargetArgs& a) {
  return a.index_64 ? CheckTargetValues<int64_t>(a) : CheckTargetValues<int32_t>(a);
}

}  // namespace

absl::Status TreePositionIds(const TreePositionsArgs& a) {
  std::vector<int64_t> open;  // rows still open at t, innermost last
  for (int64_t b = 0; b < a.batch; ++b) {
    open.clear();
    for (int64_t t = a.cu[b]; t < a.cu[b + 1]; ++t) {
      const int32_t end = a.subtree_end[t];
      if (end <= t || end > a.cu[b + 1]) {
        return absl::InvalidArgumentError(
            absl::StrCat("TreePositionIds: subtree_end[", t, "] = ", end, " is outside [", t + 1,
                         ", ", a.cu[b + 1], "] (past the row, within its sequence)"));
      }
      while (!open.empty() && !OpenAt(a.subtree_end[open.back()], t)) open.pop_back();
      a.position_ids[t] = static_cast<int64_t>(open.size());
      open.push_back(t);
    }
  }
  for (int64_t t = a.cu[a.batch]; t < a.rows; ++t) a.position_ids[t] = t - a.cu[a.batch];
  return absl::OkStatus();
}

absl::Status MultiTargetCrossEntropy(const MultiTargetArgs& a) {
  if (absl::Status s = CheckValues(a); !s.ok()) return s;
  ByTypes<RunForward>(a);
  return absl::OkStatus();
}

absl::Status MultiTargetCrossEntropyBackward(const MultiTargetArgs& a) {
  if (absl::Status s = CheckValues(a); !s.ok()) return s;
  ByTypes<RunBackward>(a);
  return absl::OkStatus();
}

}  // namespace packsched::kernels::internal::cpu
