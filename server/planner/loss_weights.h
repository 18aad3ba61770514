#ifndef PACKSCHED_SERVER_PLANNER_LOSS_WEIGHTS_H_
#define PACKSCHED_SERVER_PLANNER_LOSS_WEIGHTS_H_

// Loss weights: so that packing, micro-batching and data parallelism change the speed, never
// the gradient. The objective is sum over ranks, sum over sequences s of w_s * sum_{t in s} l_t,
// where l_t is the per-token loss (0 on ignored tokens).

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/planner/plan.h"
#include "server/planner/planner.h"

namespace packsched::planner {

enum class LossMode {
  kTokenMean,   // "token_mean": w = 1 / N_tokens (global count of loss tokens)
  kSampleMean,  // "sample_mean": w_s = 1 / (n_s * N_seq); 0 for sequences without loss tokens
  kSeqSum,      // "seq_sum" (seq-mean-token-sum): w_s = 1 / N_seq; 0 without loss tokens
  kSum,         // "sum": w = 1
  kSumNorm,     // "sum_norm": w = 1 / C (C = LossOptions::sum_norm_constant)
};

// How the trainer reduces gradients over data-parallel ranks.
enum class DpReduction {
  kSum,   // "sum": gradients are summed
  kMean,  // "mean": averaged (DDP/FSDP/Megatron): weights are multiplied by the world size
};

struct LossOptions {
  LossMode mode = LossMode::kTokenMean;
  DpReduction dp_reduction = DpReduction::kSum;
  double sum_norm_constant = 1.0;  // C of kSumNorm, > 0 and finite
};

// Counts one rank contributes to the round; the collective sums them over ranks.
// Dropped sequences count nowhere.
struct LossCounts {
  int64_t loss_tokens = 0;          // sum of loss_tokens over kept sequences
  int64_t sequences_with_loss = 0;  // kept sequences with loss_tokens > 0
};

struct LossWeights {
  std::vector<double> weights;      // per original sequence; 0 for dropped ones
  std::vector<double> loss_scales;  // per part: the common weight of its sequences, NaN if
                                    // they differ, 0 for an empty part (its dummy pass)
  int64_t loss_tokens = 0;          // loss_tokens summed over the plan's kept sequences
};

// Local counts over the kept sequences of `plan`. `loss_tokens` has one entry per original
// sequence. Returns InvalidArgument if its size differs from plan.revert.size() or an entry is
// negative.
absl::StatusOr<LossCounts> CountLoss(const MicroBatchPlan& plan,
                                     absl::Span<const int64_t> loss_tokens);
// The same counts before any plan exists: the kept sequences are those `problem` does not drop
// (every plan of it keeps exactly these). What a rank sends into the round before k is agreed.
absl::StatusOr<LossCounts> CountLoss(const Problem& problem, absl::Span<const int64_t> loss_tokens);

// Weights for this rank's sequences from the globally summed counts of the round.
// `world_size` >= 1 is used by DpReduction::kMean. A global count of 0 (nothing to learn from)
// gives weight 0 rather than a division by zero. Returns InvalidArgument for bad sizes, a
// non-positive or non-finite sum_norm_constant, or world_size < 1.
absl::StatusOr<LossWeights> ComputeLossWeights(const MicroBatchPlan& plan,
                                               absl::Span<const int64_t> loss_tokens,
                                               const LossOptions& options, const LossCounts& global,
                                               int64_t world_size);

absl::string_view Name(LossMode v);
absl::string_view Name(DpReduction v);
absl::StatusOr<LossMode> ParseLossMode(absl::string_view name);
absl::StatusOr<DpReduction> ParseDpReduction(absl::string_view name);

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_LOSS_WEIGHTS_H_
