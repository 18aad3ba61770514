#ifndef PACKSCHED_SERVER_PLANNER_PLAN_H_
#define PACKSCHED_SERVER_PLANNER_PLAN_H_

// What the planner returns: value types, host-side metadata included, so a worker can pack
// and run every micro-batch without a device-to-host sync.

#include <cstdint>
#include <vector>

namespace packsched::planner {

// One micro-batch (a "part"). All lengths are in tokens.
struct MicroBatch {
  // Original indices of its sequences, ascending.
  std::vector<int64_t> indices;
  // Sum of the real lengths.
  int64_t tokens = 0;
  // Sum of the aligned lengths (each rounded up to align_to).
  int64_t aligned_tokens = 0;
  // Rows of the packed buffer: aligned_tokens rounded up to align_total_to. The rows past
  // cu_seqlens_aligned[B] (= aligned_tokens), fewer than align_total_to, are the tail: no
  // sequence's rows. The kernels build exactly `total` rows when given it (PackAligned's `rows`,
  // Seqlens::rows; kernels.h): the tail holds the pad value, position ids restarting at 0,
  // ignore_index labels and zero loss, and attention never uses it as keys.
  int64_t total = 0;
  // Sequence count x longest aligned length: what a padded [B, S] batch of it would hold.
  int64_t padded_tokens = 0;
  // Balancing cost under the plan's cost model.
  int64_t cost = 0;
  // Longest real length (FlashAttention's max_seqlen; 0 when empty).
  int64_t max_seqlen = 0;
  // Longest aligned length.
  int64_t max_seqlen_aligned = 0;
  // int32 [B + 1] prefix sums of the real lengths, cu_seqlens[0] = 0, in `indices` order.
  std::vector<int32_t> cu_seqlens;
  // int32 [B + 1] prefix sums of the aligned lengths (TransformerEngine's cu_seqlens_padded;
  // PackAligned's output for align_to). The tail up to `total` is not in them.
  std::vector<int32_t> cu_seqlens_aligned;
  // No sequences (a rank with fewer sequences than the agreed count). Trainers that must run
  // every pass use a one-token dummy with weight 0.
  bool empty = true;
  // Holds one sequence longer than the cap (OverlongPolicy::kIsolate).
  bool overlong = false;
  // A filler: an empty micro-batch of a rank that holds nothing in the whole plan (coordinator
  // mode over a forest with fewer kept rollouts than ranks, the last resort after splitting
  // trees at rollout boundaries). The rank runs its zero-loss dummy passes for it.
  bool filler = false;
};

struct PlanStats {
  int64_t num_sequences = 0;  // given
  int64_t num_kept = 0;       // planned (not dropped)
  int64_t total_tokens = 0;   // real tokens of the kept sequences
  int64_t total_cost = 0;     // sum of part costs
  int64_t max_part_cost = 0;
  int64_t min_part_cost = 0;  // over all parts, empty ones included
  // max_part_cost / (total_cost / k); 1.0 is perfect balance (reporting only, never decides).
  double imbalance = 0.0;
  // The count no plan can go below: max(ceil(total / cap), ceil(n / max_seqs), min, 1).
  int64_t lower_bound_k = 0;
  // The smallest count the planner found for this input alone (the rank's bound k_r).
  int64_t local_k = 0;
  // Parts whose cap measure exceeds max_token_len (isolated overlong sequences, or fixed-k
  // plans without a cap guarantee such as equal_size).
  int64_t over_cap_parts = 0;
  // Tokens of a naive padded batch [num_kept, longest] and the rows the plan really uses.
  int64_t naive_padded_tokens = 0;
  int64_t packed_tokens = 0;  // sum of part totals
  // Token accounting (docs/design.md "Token accounting"): total_tokens are the logical tokens
  // (each kept sequence's or rollout's own length), packed_tokens the executed ones (rows
  // forwarded, alignment padding included); forwarded_tokens the real tokens forwarded (a
  // tree's shared prefix once per piece; total_tokens for sequences) and loss_tokens the
  // loss-bearing ones (loss_tokens summed over the kept sequences or rollouts; 0 without them).
  int64_t forwarded_tokens = 0;
  int64_t loss_tokens = 0;
};

// A plan: exactly `parts.size()` micro-batches over the kept sequences.
struct MicroBatchPlan {
  std::vector<MicroBatch> parts;
  // The kept original indices, part after part (each part's indices ascending).
  std::vector<int64_t> reorder;
  // For each original index, its position in `reorder`, or -1 if dropped.
  std::vector<int64_t> revert;
  // Dropped original indices, ascending (OverlongPolicy::kDrop, or the sequential packer's filter).
  std::vector<int64_t> dropped;
  PlanStats stats;
};

}  // namespace packsched::planner

#endif  // PACKSCHED_SERVER_PLANNER_PLAN_H_
