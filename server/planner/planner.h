#ifndef PACKSCHED_SERVER_PLANNER_PLANNER_H_
#define PACKSCHED_SERVER_PLANNER_PLANNER_H_

// The planner: how one rank's sequences are grouped into micro-batches, and how a global batch
// is balanced over data-parallel ranks. Pure (std + absl + server/base), deterministic — the
// same arguments give the same plan on every machine and build, since every decision is made
// with integers — and thread-compatible.
//
// Cap guarantee: no micro-batch exceeds `max_token_len` (in the cap mode's measure) whenever
// every aligned sequence fits the cap and the overlong policy is kReject or kDrop. kIsolate
// puts each overlong sequence alone in a part flagged `overlong`.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/planner/options.h"
#include "server/planner/plan.h"

namespace packsched::planner {

namespace internal {
struct Prepared;
}  // namespace internal

// One rank's validated, prepared planning input, with its local bound already computed.
// Creating it is the expensive, fallible half of a round; Partition() is the half that runs
// after the ranks agree on k and cannot fail for a k that honours the bound.
//
// Immutable after Create(); safe to share across threads. Cheap to copy (shared state).
class Problem {
 public:
  // Validates `lengths` (each >= 1) and `options`, applies the overlong policy and computes the
  // local bound. `options.algorithm` must be kKarmarkarKarp or kLpt (the packers are PackDataset).
  // Returns InvalidArgument naming the field and value for: a non-positive length, a value over
  // the limits in options.h, max_token_len < 1 (unless `cap_optional`), an attention cost
  // whose total would overflow int64, a required count above max_micro_batches, or an
  // overlong sequence under kReject (naming its index and length).
  static absl::StatusOr<Problem> Create(absl::Span<const int64_t> lengths,
                                        const PlanOptions& options, bool cap_optional = false);

  // The smallest micro-batch count the planner found that meets the cap and every other
  // constraint: at least lower_bound_k(), never more than best-fit-decreasing's bin count
  // (plus one per isolated sequence), rounded up to divisible_by. This is the rank's k_r.
  int64_t local_k() const;
  // max(ceil(total / cap), ceil(n / max_seqs), min_micro_batches, 1): no plan has fewer parts.
  int64_t lower_bound_k() const;
  int64_t num_sequences() const;  // given, dropped included
  int64_t num_kept() const;
  int64_t total_tokens() const;  // real tokens of the kept sequences
  // Original indices left out by OverlongPolicy::kDrop, ascending (what every plan of this
  // problem lists as `dropped`): lets a rank count its loss tokens before k is agreed.
  const std::vector<int64_t>& dropped() const;
  const PlanOptions& options() const;

  // Splits the kept sequences into exactly `k` micro-batches, minimising the largest cost as
  // far as the planner can, never breaking the cap guarantee. A larger k is never balanced
  // worse than local_k(). With equal_size, every part gets n / k sequences.
  // Returns InvalidArgument if k < local_k(), k > max_micro_batches, k is not a multiple of
  // divisible_by, or (equal_size) n % k != 0. Cannot fail otherwise.
  absl::StatusOr<MicroBatchPlan> Partition(int64_t k) const;

 private:
  explicit Problem(std::shared_ptr<const internal::Prepared> prepared);
  std::shared_ptr<const internal::Prepared> prepared_;
};

// Problem::Create(lengths, options) followed by Partition(local_k()): one rank on its own.
absl::StatusOr<MicroBatchPlan> PlanMicroBatches(absl::Span<const int64_t> lengths,
                                                const PlanOptions& options);

// Splits into exactly `k` parts without requiring a cap (max_token_len may be 0; when set, the
// cap guarantee holds as for Problem::Partition). `packsched plan --num_parts=K`.
absl::StatusOr<MicroBatchPlan> PartitionFixedK(absl::Span<const int64_t> lengths, int64_t k,
                                               const PlanOptions& options);

// Dataset packing with options.algorithm in {kFirstFitDecreasing, kBestFitDecreasing,
// kSequential}: as many micro-batches ("bins") as needed, each within max_token_len.
// kSequential keeps input order (a new bin when the next sequence does not fit). Overlong
// sequences follow options.overlong. Returns InvalidArgument as Problem::Create does, or for
// another algorithm.
absl::StatusOr<MicroBatchPlan> PackDataset(absl::Span<const int64_t> lengths,
                                           const PlanOptions& options);

// Coordinator mode (docs/design.md §2): the whole global batch, balanced over `world_size` DP ranks,
// then each rank's micro-batches with one common k (the max of the ranks' bounds).
struct RankBatch {
  std::vector<int64_t> indices;  // global indices assigned to this rank, ascending
  int64_t cost = 0;              // sum of their costs
  MicroBatchPlan plan;           // micro-batches over `indices` (plan indices are local)
};
struct BalancedBatch {
  std::vector<RankBatch> ranks;   // world_size entries
  int64_t num_micro_batches = 0;  // the common k
  std::vector<int64_t> dropped;   // global indices dropped by OverlongPolicy::kDrop, ascending
};

// Assigns the kept sequences to ranks with equal counts (differing by at most one when
// n % world_size != 0) and balanced cost. With `group_ids` (one per sequence, any int64), the
// members of a group stay on one rank, and no rank holds more than ceil(n / world_size) +
// (largest group - 1) sequences. Each rank's micro-batches then follow `options` exactly as
// Problem::Create + Partition(k) would, with k the largest of the ranks' local bounds.
// Returns InvalidArgument for bad lengths/options (as Problem::Create), world_size < 1 or
// above kMaxWorldSize, group_ids of the wrong size, or world_size x k above
// options.max_micro_batches (checked before the micro-batches are allocated: every rank gets k
// of them, empty ones included).
absl::StatusOr<BalancedBatch> BalanceBatch(absl::Span<const int64_t> lengths, int64_t world_size,
                                           const PlanOptions& options,
                                           absl::Span<const int64_t> group_ids = {});

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_PLANNER_H_
