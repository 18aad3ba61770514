#ifndef PACKSCHED_SERVER_PLANNER_KARMARKAR_KARP_H_
#define PACKSCHED_SERVER_PLANNER_KARMARKAR_KARP_H_

// k-way Karmarkar–Karp (largest differencing) over integer costs, with sparse states.

#include <cstdint>

#include "absl/types/span.h"
#include "server/planner/prepared.h"

namespace packsched::planner::internal {

// Partitions items 0..costs.size()-1 into exactly `k` parts (some possibly empty) by the
// k-way largest differencing method: every item starts as a k-tuple (cost, 0, ..., 0); the two
// tuples with the largest spread (max - min) are merged by pairing one's largest sums with the
// other's smallest, until one tuple remains.
//
// A tuple stores only its non-empty sums (a min-heap plus the running max), and a merge moves
// the smaller tuple into the larger one, touching only the larger one's smallest slots: the
// whole run costs O(n log^2 n) time and O(n) memory, independent of k — not the O(n·k) of
// dense tuples. Ignores caps. Deterministic. REQUIRES: k >= 1, costs >= 0.
Parts KarmarkarKarp(absl::Span<const int64_t> costs, int64_t k);
// The same, given `cost_order` == OrderByCostDesc(costs) (lpt.h), which it would compute.
Parts KarmarkarKarp(absl::Span<const int64_t> costs, absl::Span<const int32_t> cost_order,
                    int64_t k);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_KARMARKAR_KARP_H_
