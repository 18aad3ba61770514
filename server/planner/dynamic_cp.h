#ifndef PACKSCHED_SERVER_PLANNER_DYNAMIC_CP_H_
#define PACKSCHED_SERVER_PLANNER_DYNAMIC_CP_H_

// Dynamic context parallelism (docs/design.md §2, "Dynamic context parallelism"): the step's
// sequences on a domain of R ranks (R = dp x cp_max), planned slot by slot. In every micro-batch
// slot the R ranks are split into context-parallel (CP) groups of consecutive ranks, each of a
// size the caller allows; a group of size c runs one packed micro-batch whose sequences are each
// aligned to 2 * c * tp and sharded head-tail over its c ranks (kernels' CpShard). A sequence runs
// on exactly one group of one slot. The plan minimises the step's time
//   step = sum over slots of the slot's costliest group,
//   group = micro_batch + sum over its sequences of h(L, c),
//   h(L, c) = (linear * L + quadratic * L^2) / c + comm * L * (c - 1) / c   (L aligned),
// the work one rank of the group does for a sequence (compute split c ways) plus the keys and
// values it receives and sends (all-gather forward, reduce-scatter backward), while every rank's
// rows stay within the cap: the group's aligned tokens / c <= max_tokens_per_rank.

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/planner/loss_weights.h"
#include "server/planner/model_cost.h"

namespace packsched::planner {

// Which CP group sizes a slot may use (always within [min_cp, max_cp]).
enum class CpSizeRule {
  kPowersOfTwo,  // "powers_of_two": 1, 2, 4, ... (Megatron-Core's hybrid CP groups)
  kDivisors,     // "divisors": the divisors of R
  kAny,          // "any": every size
};

// Integer weights of h(L, c) above, in one unit (FLOPs, scaled as ModelCost is). The
// communication weight depends on the group: `comm` for a group of at most `node_ranks` ranks
// (consecutive ranks within a node, e.g. NVLink), `comm_across_nodes` for a larger one.
struct CpCostModel {
  int64_t linear = 1;             // per token
  int64_t quadratic = 0;          // per token^2 (causal attention)
  int64_t comm = 0;               // per token a rank receives and sends, FLOP-equivalents
  int64_t micro_batch = 0;        // per non-empty micro-batch of a group
  int64_t node_ranks = 0;         // 0: every group is within a node
  int64_t comm_across_nodes = 0;  // `comm` for groups larger than node_ranks
};

// The most CP groups a plan lists, every slot's together, idle ones included (about 100 bytes
// each in the plan): the plan's size, whatever the options (DynamicCpOptions::max_groups).
inline constexpr int64_t kMaxCpGroups = int64_t{1} << 21;
// The most rank-slots a plan spans, slots x R: what a consumer that walks every rank of every
// slot handles (the CLI's JSON lists each group's ranks; a sidecar's views of every rank).
inline constexpr int64_t kMaxCpRankSlots = int64_t{1} << 26;
// The most allowed CP sizes under CpSizeRule::kAny (powers of two are at most 21 and the
// divisors of R <= 2^20 at most 240): the planner's work per sequence and per packed group.
inline constexpr int64_t kMaxCpSizes = 4096;

struct DynamicCpOptions {
  int64_t ranks = 1;                // R >= 1
  int64_t max_tokens_per_rank = 0;  // the cap on one rank's rows of a micro-batch, >= 1
  CpSizeRule sizes = CpSizeRule::kPowersOfTwo;
  int64_t min_cp = 1;           // >= 1
  int64_t max_cp = 0;           // cp_max: 0 = R; must divide R
  int64_t tensor_parallel = 1;  // a sequence on c ranks is aligned to 2 * c * tensor_parallel
  int64_t divisible_by = 1;     // the slot count is a multiple (pipeline / virtual stages)
  CpCostModel cost;
  // The most groups the plan may list, in [1, kMaxCpGroups]: not a schema option; a sidecar
  // lowers it to the groups it reserved memory for (server/service/request_memory.h).
  int64_t max_groups = kMaxCpGroups;
};

// One CP group of one slot: ranks [first_rank, first_rank + size).
struct CpGroupPlan {
  int64_t first_rank = 0;
  int64_t size = 0;
  int64_t name = 0;                 // index into DynamicCpPlan::group_names
  std::vector<int64_t> sequences;   // input indices, ascending; empty for an idle group
  std::vector<int32_t> cu_seqlens;  // aligned offsets of the group's micro-batch (B + 1 values),
                                    // every length a multiple of 2 * size * tensor_parallel
  int64_t tokens_per_rank = 0;      // cu_seqlens.back() / size, <= max_tokens_per_rank
  int64_t cost = 0;                 // one member rank's cost (0 when idle)
};

struct CpSlotPlan {
  std::vector<CpGroupPlan> groups;  // in rank order; together exactly the ranks [0, R)
  int64_t cost = 0;                 // the costliest group's
};

struct DynamicCpPlan {
  std::vector<CpSlotPlan> slots;  // a multiple of divisible_by (trailing slots may be idle)
  // The distinct groups, (first_rank, size) each, in order of first use: a trainer creates one
  // process group per name and reuses it in every slot.
  std::vector<std::pair<int64_t, int64_t>> group_names;
  std::vector<int64_t> cp_of_sequence;    // per input sequence: its group's size
  std::vector<int64_t> slot_of_sequence;  // per input sequence: its slot
  int64_t step_cost = 0;                  // sum of the slots' costs
  // No plan's step_cost is below it: max(ceil(sum over sequences of min_c c * h(L, c) / R),
  // micro_batch + max over sequences of min_c h(L, c)), c over the allowed sizes that fit.
  int64_t lower_bound = 0;
  int64_t comm_tokens = 0;  // sum over sequences of L * (c - 1): the token rows of keys and
                            // values the group's ranks receive together, each direction
};

// Plans `lengths` (each >= 1) under `options`. Never returns a plan with a rank over the cap:
// every sequence runs at an allowed size c whose aligned length / c fits it. Deterministic.
// Returns InvalidArgument naming the option for: ranks < 1 or > 2^20, max_tokens_per_rank < 1,
// min_cp < 1, max_cp < 0 or max_cp not dividing ranks, min_cp > max_cp, tensor_parallel < 1,
// divisible_by < 1, max_tokens_per_rank * max_cp >= 2^31 (int32 offsets), a negative cost
// weight, no allowed size in [min_cp, max_cp], allowed sizes that cannot split R ranks exactly
// (e.g. powers of two of at least 4 for R = 6); naming the sequence for a length < 1 or a
// sequence that exceeds the cap even on the largest allowed group; and for costs that overflow
// int64.
//
// The plan's size is bounded whatever the request. With k = roundup(P, divisible_by) slots, P
// the packed (non-idle) slots (P <= n: each holds a sequence), every slot lists between
// R / max_cp groups (each has at most max_cp ranks) and R / min_cp (the idle ranks of a slot
// go in the largest allowed sizes that split them), so the plan lists G groups,
// k * R / max_cp <= G <= k * R / min_cp. Refused (InvalidArgument naming world_size, min_cp,
// max_cp and divisible_by), so that no request, however small, makes unbounded work or memory:
//  - before anything is allocated, options under which every non-empty plan is too large:
//    divisible_by * R / max_cp > max_groups ("divisible_by = ..."), divisible_by * R >
//    kMaxCpRankSlots ("divisible_by = ..."), and sizes = any over more than kMaxCpSizes sizes
//    ("min_cp = ...");
//  - after packing, before any group is made: a plan that would list more than max_groups
//    groups or span more than kMaxCpRankSlots rank-slots (k * R), counted exactly.
// Work and memory, S allowed sizes (at most 21 powers of two, 240 divisors of R <= 2^20, or
// kMaxCpSizes), U <= min(n, S) sizes in use at one floor, F size floors (at most about
// log2 R + 2): time O(R S' + n S + F (n log n + 10 n (P + log R) + P R S m)) — the sizes'
// splits of every width up to R (S' = S, or 1 under any), the sequences sorted by length once (a
// floor re-sorts only runs of equal cost), each floor packed at most 10 times (a sequence scans the
// slots and sifts one heap of groups), each packed slot's free ranks spent in at most R splits or
// widenings over its m sequences and the sizes above its group's — then O(G log S) to split the
// idle ranks; memory O(R + n + P U + G) words, G <= max_groups. R = 256 with 4,096 sequences: about
// 6 ms of CPU time on a 2-core VM (docs/benchmarks.md). The largest plan the limits allow from
// one sequence, 2^20 ranks in groups of one and divisible_by = 2 (2^21 groups): the CLI plans
// and writes its JSON in about 4 s and 0.8 GB, the Python binding builds its dicts in 19 s and
// 2.3 GB (docs/decisions.md, "Dynamic CP: the plan's size bounded at every door").
absl::StatusOr<DynamicCpPlan> PlanDynamicCp(absl::Span<const int64_t> lengths,
                                            const DynamicCpOptions& options);

// The cost one rank of a group of `cp` ranks pays for a sequence of `aligned` tokens (a multiple
// of 2 * cp), h(L, c) above; nullopt on overflow.
std::optional<int64_t> CpSequenceCost(const CpCostModel& cost, int64_t aligned, int64_t cp);

// The aligned length of a sequence of `length` tokens on `cp` ranks: a multiple of
// 2 * cp * tensor_parallel. nullopt on overflow.
std::optional<int64_t> CpAlignedLength(int64_t length, int64_t cp, int64_t tensor_parallel);

// Per-sequence loss weights of a dynamic-CP step, the rule of loss_weights.h with every
// sequence kept and the counts global (one call sees the whole step): the objective is
// sum over sequences of w_s * (its tokens' losses), each group's ranks summing their shards'.
// `ranks` is the world size DpReduction::kMean averages over (R). InvalidArgument for a negative
// entry, ranks < 1 or a bad sum_norm_constant.
absl::StatusOr<std::vector<double>> DynamicCpLossWeights(absl::Span<const int64_t> loss_tokens,
                                                         const LossOptions& options, int64_t ranks);

// The communication weight of CpCostModel for a model: per token, the bytes of its keys and
// values over all layers (num_kv_heads x head_dim x 2 x bytes_per_element each), forward and
// backward, times flops_per_byte (the device's FLOP/s over one link's bytes/s), divided by
// 2^cost.shift as ModelCost's weights are. InvalidArgument for flops_per_byte < 0 or
// bytes_per_element < 1, or an overflow.
absl::StatusOr<int64_t> CpCommWeight(const ModelConfig& config, const ModelCost& cost,
                                     double flops_per_byte, int64_t bytes_per_element);

absl::string_view Name(CpSizeRule v);
absl::StatusOr<CpSizeRule> ParseCpSizeRule(absl::string_view name);

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_DYNAMIC_CP_H_
