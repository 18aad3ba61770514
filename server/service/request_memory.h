#ifndef PACKSCHED_SERVER_SERVICE_REQUEST_MEMORY_H_
#define PACKSCHED_SERVER_SERVICE_REQUEST_MEMORY_H_

// What a request may cost in memory, estimated from the request alone before anything sized by
// it is allocated: the service reserves it from the in-flight budget (memory_budget.h) first.
// Pure functions of their arguments. Thread-safe.

#include <cstdint>

#include "packsched/v1/scheduler.pb.h"
#include "server/planner/dynamic_cp.h"
#include "server/service/limits.h"

namespace packsched::service {

// Memory per request (docs/design.md §3): a request's peak bytes, estimated from the request
// alone before anything sized by it is allocated, as
//   kPeakBase + kPeakPerSequence·n + kPeakPerMicroBatch·k + kPeakPerRank·W
//             + kPeakPerWireByte·wire
// with n its sequences, wire its serialized size, k the most micro-batches the request can make
// this sidecar build and W its ranks (BalanceBatch's world_size; 0 for Plan and Partition)
// (RequestMemory). The constants are measured (tests/bench/memory_bench.py,
// tests/python/test_request_memory_peak.py; docs/benchmarks.md) with a margin: an empty
// micro-batch costs about 370 bytes at its peak (the planner's part, the response message, the
// wire copy), a sequence about 150, and a BalanceBatch rank about 1,160 more (its planner
// problem and plan, its index list, its RankPlan and PlanResponse messages and their wire copy:
// world_size = n = 400,000 under sync "step" peaks at 1,717 bytes per rank over the fresh
// sidecar's, all four terms together).
inline constexpr int64_t kPeakBase = int64_t{1} << 20;
inline constexpr int64_t kPeakPerSequence = 160;
inline constexpr int64_t kPeakPerMicroBatch = 400;
inline constexpr int64_t kPeakPerWireByte = 2;
inline constexpr int64_t kPeakPerRank = 1536;
// A forest adds (docs/design.md §3, "Memory per request"; tests/python/test_memory_guarantee.py)
//   + kPeakPerTreeMicroBatch·k + kPeakPerIsolatedEntry·I + kPeakPerSplitEntry·S
// A tree micro-batch holds a piece (its nodes and rollouts), its layout and its rollout view:
// fan-out at cap 2 (one leaf a micro-batch) peaks at about 820 bytes each, all terms together.
// A piece repeats the nodes on its rollouts' paths: I bounds the node occurrences of isolated
// pieces (the path of each rollout over the cap: 8 bytes each, up to 16 while its vector
// grows) and S those of the pieces of trees over the cap (each kept rollout's path: the cut's
// memberships and its (piece, node) set, measured at up to 75 bytes each).
inline constexpr int64_t kPeakPerTreeMicroBatch = 512;
inline constexpr int64_t kPeakPerIsolatedEntry = 24;
inline constexpr int64_t kPeakPerSplitEntry = 128;

struct RequestMemory {
  int64_t sequences = 0;      // n
  int64_t micro_batches = 0;  // k: the most micro-batches the request can make this sidecar build
  int64_t wire_bytes = 0;     // the request's serialized size
  int64_t ranks = 0;          // W: BalanceBatch's world_size (when valid); 0 otherwise
  int64_t isolated_entries = 0;  // I (forests): nodes on the paths of rollouts over the cap
  int64_t split_entries = 0;     // S (forests): nodes on the paths of rollouts of split trees
  bool forest = false;           // the request plans a forest
  int64_t bytes = 0;             // the estimated peak (saturates at INT64_MAX)
};

// The formula above.
int64_t PeakBytes(int64_t sequences, int64_t micro_batches, int64_t wire_bytes, int64_t ranks);

// k for each request (values validation refuses count nothing: such a request allocates nothing
// sized by them). d = divisible_by, m = min_micro_batches, K = the request's max_micro_batches
// (at most the server's):
//  - Plan: min(K, roundup(max(m, b, 1), d)), b the planner's largest possible local bound: n, or,
//    in tokens mode without a count limit, 1 + (aligned tokens) / (cap/2 - align_total_to + 1)
//    plus the sequences over the cap (best fit leaves at most one part at most half full). A
//    round whose peers raise k above this is not reserved again (docs/design.md §3).
//  - Partition: num_micro_batches.
//  - BalanceBatch: world_size x the per-rank count of Plan over the largest rank's share, plus d
//    under sync step without groups when the share is above one sequence and world_size x that
//    is within K (the one step above the k bound that sync may take).
// With a forest, n is its nodes + rollouts, and b its rollouts (at most one piece each). I and
// S come from one pass over the forest under the request's cap: a tree whose tokens fit the
// room (the cap after align_total_to, rounded down to align_to) is one piece and adds none; of
// a larger tree, each rollout longer than the room adds its path's nodes to I (under the
// isolate policy), each other one to S. BalanceBatch with group_ids cuts every tree at its
// groups first (planner::SplitByGroup copies each node once per group through it, at most once
// per rollout path it is on): every rollout within the room then adds its path's nodes to S, a
// tree that fits included (not measured apart: the copies cost about what the cut's entries
// do). A forest that validation refuses adds none.
RequestMemory EstimatePlanMemory(const v1::PlanRequest& request, const ServiceLimits& limits);
RequestMemory EstimatePartitionMemory(const v1::PartitionRequest& request,
                                      const ServiceLimits& limits);
RequestMemory EstimateBalanceBatchMemory(const v1::BalanceBatchRequest& request,
                                         const ServiceLimits& limits);

// PlanDynamicCp is admitted in two steps. Before planning: the formula above with k = S, the most
// slots (roundup(max(n, 1), d): every slot but the trailing idle ones holds a sequence), W = 0,
// plus kPeakPerCpGroup for each group of d slots, d x ceil(world_size / min_cp) (every slot covers
// the ranks: the planner's groups of the first slot and of the trailing idle ones, at most
// d - 1; the other slots' groups are not bounded before planning).
// After planning, before the response is written, its views are reserved too
// (DynamicCpResponseBytes): kPeakPerCpView for each slot of each rank asked for (a CpRankSlot
// message and its wire copy) and kPeakPerCpSequenceView for each sequence's entry in a view (its
// index, owner, owner index, offset and weight, on the arena and on the wire). Measured on fresh
// sidecars (docs/design.md §3, "Memory per request"): the two steps together cover the peak.
// The planner is held to what the first step reserves (DynamicCpGroupsReserved): its busy groups
// are at most n (one sequence each at least, in the per-slot term: k >= n) and its idle ones are
// what the groups term covers, so a plan that would list more groups is refused
// (InvalidArgument naming world_size, min_cp, max_cp and divisible_by) instead of outgrowing it.
inline constexpr int64_t kPeakPerCpGroup = 320;
inline constexpr int64_t kPeakPerCpView = 256;
inline constexpr int64_t kPeakPerCpSequenceView = 128;
RequestMemory EstimateDynamicCpMemory(const v1::PlanDynamicCpRequest& request,
                                      const ServiceLimits& limits);
// DynamicCpOptions::max_groups under a sidecar: min(planner::kMaxCpGroups,
// n + d x ceil(world_size / min_cp)); planner::kMaxCpGroups for options that validation refuses.
int64_t DynamicCpGroupsReserved(int64_t sequences, const planner::DynamicCpOptions& options);
// The response of `views` rank views of a slot holding `entries` sequence entries in all.
int64_t DynamicCpResponseBytes(int64_t views, int64_t entries);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_REQUEST_MEMORY_H_
