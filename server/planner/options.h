#ifndef PACKSCHED_SERVER_PLANNER_OPTIONS_H_
#define PACKSCHED_SERVER_PLANNER_OPTIONS_H_

// The knobs of one planning call. Plain values, copyable, no defaults hidden elsewhere: every
// default below is the documented one, shared by the CLI, the sidecar and the Python package.

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packsched::planner {

// What the `max_token_len` cap measures for one micro-batch.
enum class CapMode {
  kTokens,  // sum of the aligned lengths, rounded up to align_total_to (padding-free trainers)
  kPadded,  // number of sequences x longest aligned length (trainers that still pad)
};

enum class Algorithm {
  kKarmarkarKarp,       // "kk": k-way largest differencing; never worse than kLpt
  kLpt,                 // "lpt": longest first to the least loaded part
  kFirstFitDecreasing,  // "ffd": dataset packing, as many bins as needed
  kBestFitDecreasing,   // "bfd": dataset packing, as many bins as needed
  kSequential,          // "sequential": dataset packing in input order (streaming)
};

// The cost the balancing equalises. The cap is always on tokens (see CapMode).
enum class CostModel {
  kTokens,     // cost = aligned length
  kAttention,  // cost = a * L + b * L^2 over the aligned length L (see AttentionCost)
};

// What happens to a sequence whose aligned length alone exceeds the cap.
enum class OverlongPolicy {
  kReject,   // InvalidArgument naming the sequence and its length
  kIsolate,  // alone in its own micro-batch, flagged `overlong`
  kDrop,     // left out of the plan: listed in `dropped`, revert = -1, no loss weight
};

// Order of the micro-batches in the returned plan.
enum class PartOrder {
  kCostDesc,    // largest cost first (ties: smallest first index)
  kIndex,       // by smallest original index; empty micro-batches last
  kInterleave,  // small at both ends, large in the middle (pipeline-bubble friendly)
};

// What a coordinator-mode step waits for (BalanceBatch; docs/design.md §2).
enum class Sync {
  kStep,        // ranks meet once per step (DDP): the step lasts max over ranks of their totals
  kMicroBatch,  // ranks meet at every micro-batch (FSDP/ZeRO-3, PP, CP): the step lasts the sum
                // over slots i of max over ranks of micro-batch i's cost
};

// Integer weights of the attention cost model, cost(L) = linear * L + quadratic * L^2, plus the
// terms of layers whose attention does not see the whole sequence (a model's sliding-window and
// chunked layers, model_cost.h; never set by the wire options, only by a model config):
//   + windowed * Scores(L, window) + chunked * Chunks(L, chunk)
// where, over the positions p < L of the sequence, a query that sees k keys counts 2k - 1 (so
// that a full causal sequence counts L^2 in all, the quadratic term's L^2):
//   Scores(L, w) = sum_p (2 min(p + 1, w) - 1)    = L^2 while L <= w, else w^2 + (2w - 1)(L - w)
//   Chunks(L, c) = sum_p (2 (p mod c + 1) - 1)    = (L / c) c^2 + (L mod c)^2
// Scores(L, w) is the kernels' count for a left window of w - 1 (kernels/common/attention_tile.h:
// key j seen by query i iff i - j <= w - 1), as transformers' sliding window w is. The defaults
// are the FLOP ratio of a causal decoder layer with hidden size 2048: about 24·h² FLOPs per token
// in the matmuls against 2·h·L for causal attention, i.e. 12·h : 1.
struct AttentionCost {
  int64_t linear = 24576;
  int64_t quadratic = 1;
  int64_t windowed = 0;  // weight of the sliding-window layers' scores, [0, kMaxAttentionWeight]
  int64_t window = 0;    // their window in tokens, [1, kMaxLength] when windowed > 0
  int64_t chunked = 0;   // weight of the chunked layers' scores, [0, kMaxAttentionWeight]
  int64_t chunk = 0;     // their chunk in tokens, [1, kMaxLength] when chunked > 0
};

// The attention terms of cost(L) above for the positions [from, to) of a sequence (a tree node
// at depth `from`; the whole sequence from 0): quadratic (to^2 - from^2) + windowed (Scores(to)
// - Scores(from)) + chunked (Chunks(to) - Chunks(from)). nullopt on int64 overflow. REQUIRES:
// 0 <= from <= to <= kMaxLength, the weights and sizes in their ranges.
std::optional<int64_t> AttentionScores(const AttentionCost& a, int64_t from, int64_t to);

// Documented limits: larger values are InvalidArgument naming the field and value.
inline constexpr int64_t kMaxSequences = int64_t{1} << 26;  // sequences per call
inline constexpr int64_t kMaxLength =
    (int64_t{1} << 31) - 1;  // tokens per sequence, aligned (int32 offsets)
inline constexpr int64_t kMaxAlign = int64_t{1} << 20;            // align_to, align_total_to
inline constexpr int64_t kMaxAttentionWeight = int64_t{1} << 32;  // each of a and b
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;        // BalanceBatch ranks
inline constexpr int64_t kDefaultMaxMicroBatches = 1'000'000;

struct PlanOptions {
  // Cap per micro-batch in tokens (see CapMode). 0 = no cap, allowed only where k is given
  // (Problem::Partition with an explicit k, `packsched plan --num_parts`). Otherwise >= 1 and
  // <= kMaxLength (micro-batch offsets are int32).
  int64_t max_token_len = 0;
  CapMode cap_mode = CapMode::kTokens;
  // Largest number of sequences in one micro-batch; 0 = unlimited.
  int64_t max_seqs_per_micro_batch = 0;
  // The plan has at least this many micro-batches (>= 1).
  int64_t min_micro_batches = 1;
  // The micro-batch count is a multiple of this (pipeline parallelism), >= 1.
  int64_t divisible_by = 1;
  // Each sequence is padded to a multiple of this (e.g. 2·tp·cp); the cap and the costs use the
  // aligned lengths. In [1, kMaxAlign].
  int64_t align_to = 1;
  // Each micro-batch's total is padded to a multiple of this (e.g. Ulysses sequence parallelism).
  // In tokens mode the cap holds for the padded total. In [1, kMaxAlign].
  int64_t align_total_to = 1;
  Algorithm algorithm = Algorithm::kKarmarkarKarp;
  CostModel cost = CostModel::kTokens;
  AttentionCost attention;
  OverlongPolicy overlong = OverlongPolicy::kReject;
  PartOrder order = PartOrder::kCostDesc;
  // Upper bound on the micro-batch count: a larger count, required or requested, is
  // InvalidArgument — it is never clamped below what the cap needs.
  int64_t max_micro_batches = kDefaultMaxMicroBatches;
  // Fixed-k only: every micro-batch gets exactly n / k sequences (n % k != 0 is
  // InvalidArgument); cost is balanced, the cap is not guaranteed.
  bool equal_size = false;
  // Context-parallel ranks sharing each micro-batch (head-tail shards, see docs/design.md
  // "Context parallelism"), in [1, kMaxAlign]. max_token_len keeps its meaning: the tokens of one
  // micro-batch before the CP split. With context_parallel > 1 the attention cost of a sequence
  // is divided over the CP ranks, and align_to defaults as EffectiveAlignTo says.
  int64_t context_parallel = 1;
  // Tensor-parallel ranks (sequence parallelism), in [1, kMaxAlign]; only sets align_to's default.
  int64_t tensor_parallel = 1;
};

// The alignment that context and tensor parallelism need: 2 * cp * tp with context_parallel > 1
// (each sequence is cut into 2 * cp chunks, each divisible by tp), else tp (sequence parallelism
// splits the rows over the tp ranks; no head-tail split without CP). 1 without either.
int64_t ParallelAlign(const PlanOptions& o);

// The align_to a plan uses: options.align_to, or ParallelAlign(o) when align_to is 1 (its
// default). REQUIRES: the options' ranges are valid (Validate checks that an explicit align_to
// is a multiple of ParallelAlign).
int64_t EffectiveAlignTo(const PlanOptions& o);

// Names used by the CLI, the proto and the Python package ("kk", "tokens", "cost_desc", ...).
absl::string_view Name(CapMode v);
absl::string_view Name(Algorithm v);
absl::string_view Name(CostModel v);
absl::string_view Name(OverlongPolicy v);
absl::string_view Name(PartOrder v);
absl::string_view Name(Sync v);

// Inverses of Name(); InvalidArgument listing the accepted names for anything else.
absl::StatusOr<CapMode> ParseCapMode(absl::string_view name);
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name);
absl::StatusOr<CostModel> ParseCostModel(absl::string_view name);
absl::StatusOr<OverlongPolicy> ParseOverlongPolicy(absl::string_view name);
absl::StatusOr<PartOrder> ParsePartOrder(absl::string_view name);
absl::StatusOr<Sync> ParseSync(absl::string_view name);

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_OPTIONS_H_
