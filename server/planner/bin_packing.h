#ifndef PACKSCHED_SERVER_PLANNER_BIN_PACKING_H_
#define PACKSCHED_SERVER_PLANNER_BIN_PACKING_H_

// Bin packing to the cap: as many parts ("bins") as needed, each within `capacity`.

#include "absl/types/span.h"
#include "server/planner/prepared.h"

namespace packsched::planner::internal {

// First fit decreasing: items by aligned length descending (ties by position), each into the
// first opened bin it fits. O(n log n). REQUIRES: no item is overlong for `capacity`.
Parts FirstFitDecreasing(absl::Span<const Item> items, const Capacity& capacity);

// Best fit decreasing: as FFD, into the fullest bin it fits; among equally full bins, the one
// that reached that fill first (TRL's rule: the same bins as its BFD). O(n log n). Same REQUIRES.
Parts BestFitDecreasing(absl::Span<const Item> items, const Capacity& capacity);
// The same with the visiting order given: `order` must be the positions of `items` by aligned
// length descending, ties by position ascending (callers that have it already skip a sort).
Parts BestFitDecreasing(absl::Span<const Item> items, const Capacity& capacity,
                        absl::Span<const int32_t> order);

// Items in their given order; a new bin whenever the next item does not fit the current one.
// O(n). Same REQUIRES.
Parts Sequential(absl::Span<const Item> items, const Capacity& capacity);

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_BIN_PACKING_H_
