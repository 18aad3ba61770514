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
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
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
  // `costs`: empty (costs from options.cost), or one balancing cost per sequence, each in
  // [0, 2^62], used instead of the cost model (a tree piece's cost: tree_plan.h).
  static absl::StatusOr<Problem> Create(absl::Span<const int64_t> lengths,
                                        const PlanOptions& options, bool cap_optional = false,
                                        absl::Span<const int64_t> costs = {});

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
                                               const PlanOptions& options,
                                               absl::Span<const int64_t> costs = {});

// Dataset packing with options.algorithm in {kFirstFitDecreasing, kBestFitDecreasing,
// kSequential}: as many micro-batches ("bins") as needed, each within max_token_len.
// kSequential keeps input order (a new bin when the next sequence does not fit). Overlong
// sequences follow options.overlong. Returns InvalidArgument as Problem::Create does, or for
// another algorithm.
absl::StatusOr<MicroBatchPlan> PackDataset(absl::Span<const int64_t> lengths,
                                           const PlanOptions& options,
                                           absl::Span<const int64_t> costs = {});

// Checks `options` alone, before any length is read: the ranges, names and rules between
// fields that the entry points above and BalanceBatch check (and in the same words). A cap of
// 0 passes (PartitionFixedK needs none), and the algorithm may be a balancing or a packing one
// (the entry point it suits is the caller's choice). Returns InvalidArgument naming the field.
absl::Status CheckOptions(const PlanOptions& options);

// Coordinator mode (docs/design.md §2): the whole global batch, balanced over `world_size` DP
// ranks, then each rank's micro-batches with one common k.
struct RankBatch {
  std::vector<int64_t> indices;  // global indices assigned to this rank, ascending
  int64_t cost = 0;              // sum of their costs
  MicroBatchPlan plan;           // micro-batches over `indices` (plan indices are local)
};

// Coordinator-mode knobs that are not plan options (they describe the step, not a rank's plan).
struct BalanceOptions {
  Sync sync = Sync::kStep;
  // A fixed cost per non-empty micro-batch (e.g. FSDP's parameter gather), in the cost model's
  // units; >= 0 and <= kMaxMicroBatchCost. It enters the step costs below and the choice of k
  // under kMicroBatch (fewer micro-batches when the saved fixed costs outweigh the balance).
  int64_t micro_batch_cost = 0;
  // Asked in the planner's long loops, about every 2^16 steps (well under a millisecond apart on
  // one core), on the planning thread: a non-OK answer ends the call with that status (e.g.
  // Cancelled when the caller has gone, DeadlineExceeded past its deadline). Empty: the call
  // runs to its end.
  std::function<absl::Status()> stop;
};
inline constexpr int64_t kMaxMicroBatchCost = int64_t{1} << 50;

// How long the plan's step is under the cost model (reporting: decides nothing afterwards).
// A micro-batch of rank r in slot i costs micro_batch_cost + the sum of its sequences' costs, 0
// when empty.
struct StepStats {
  int64_t step_sync_cost = 0;         // max over ranks of the sum over slots (Sync::kStep)
  int64_t micro_batch_sync_cost = 0;  // sum over slots of the max over ranks (Sync::kMicroBatch)
  // (total cost + micro_batch_cost x k_min x W) / W with k_min = ceil(aligned tokens / (W x cap)):
  // every rank equally busy with the fewest micro-batches the cap allows.
  double ideal = 0.0;
  double efficiency = 0.0;  // ideal / the cost under the request's sync (1.0 when both are 0)
  // No plan, under either sync, has a step below this: max(ceil((total cost + micro_batch_cost
  // x the fewest micro-batches the cap allows) / W), micro_batch_cost + the largest sequence).
  int64_t lower_bound = 0;
  double lower_bound_efficiency = 0.0;  // ideal / lower_bound: the best efficiency possible
};

struct BalancedBatch {
  std::vector<RankBatch> ranks;   // world_size entries
  int64_t num_micro_batches = 0;  // the common k
  std::vector<int64_t> dropped;   // global indices dropped by OverlongPolicy::kDrop, ascending
  StepStats step;
};

// Assigns the kept sequences to ranks and plans every rank's micro-batches with one common k:
// ranks[r].plan.parts[i] is rank r's micro-batch in slot i (empty ones included).
//
// balance.sync == kStep (the default): equal counts per rank (differing by at most one when
// n % world_size != 0) and balanced rank costs; each rank's micro-batches follow `options`
// exactly as Problem::Create + Partition(k) would, with k the largest of the ranks' local
// bounds, or, where trades of sequences between those micro-batches of different ranks (counts
// unchanged, each within the cap) shorten the step, the traded ones. Without group_ids, a plan
// with counts free (moves as well as trades, up to the k bound below) replaces it when its step
// is shorter by more than 1/1024; and when that k is above the k bound, the ranks take whole
// first-fit-decreasing bins of the global batch, balanced by cost, then moves and trades of
// sequences between ranks. Counts may then differ. Last, the plan so far, the FFD bins and (when
// it needs no more) the equal-count plan, each given one step of divisible_by above the k bound
// and shortened by moves and trades, replace it when the shortest of them is shorter by more
// than 1/1024 (alpha per non-empty micro-batch counted), within max_micro_batches.
//
// balance.sync == kMicroBatch: every rank's micro-batch in slot i costs nearly the same, so a
// step whose ranks meet at every micro-batch is short; ranks may hold different numbers of
// sequences. The slots are put in options.order by their costs (the largest over ranks) and
// smallest global index: the same permutation on every rank.
//
// Under both: no micro-batch breaks the cap (the cap guarantee of Problem::Partition), and
// without group_ids k <= the k bound, ceil(FFD bins of the global batch / world_size) rounded up
// to divisible_by (and at least min_micro_batches), or under kStep one step of divisible_by more
// when that shortens the step by more than 1/1024. With `group_ids` (one per sequence, any
// int64) the members of a group stay on one rank (no rank holds more than ceil(n / world_size)
// + (largest group - 1) sequences); k is then at least the largest rank's own bound.
// Returns InvalidArgument for bad lengths/options (as Problem::Create), world_size < 1 or
// above kMaxWorldSize, group_ids of the wrong size, micro_batch_cost out of range or making a
// step's cost overflow int64, or world_size x k above options.max_micro_batches (checked
// before the micro-batches are allocated: every rank gets k of them, empty ones included).
// `costs` as for Problem::Create.
absl::StatusOr<BalancedBatch> BalanceBatch(absl::Span<const int64_t> lengths, int64_t world_size,
                                           const PlanOptions& options,
                                           absl::Span<const int64_t> group_ids = {},
                                           const BalanceOptions& balance = {},
                                           absl::Span<const int64_t> costs = {});

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_PLANNER_H_
