#ifndef PACKSCHED_SERVER_PLANNER_PREPARED_H_
#define PACKSCHED_SERVER_PLANNER_PREPARED_H_

// Internal to the planner: the validated form of one planning input and the capacity rules
// every algorithm shares. Not part of the public API.

#include <cstdint>
#include <memory_resource>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/planner/options.h"
#include "server/planner/plan_memory.h"

namespace packsched::planner::internal {

// One kept sequence. `cost` is under the options' cost model, over the aligned length.
struct Item {
  int64_t index = 0;    // original position in the caller's lengths
  int64_t length = 0;   // real tokens
  int64_t aligned = 0;  // length rounded up to align_to
  int64_t cost = 0;
};

// A partition: each part lists positions into an item array. Allocated from PlanMemory() by
// whatever makes one (the planner's functions make theirs there).
using Part = std::pmr::vector<int32_t>;
using Parts = std::pmr::vector<Part>;

// What a part holds, as far as the capacity rules care.
struct PartLoad {
  int64_t cost = 0;
  int64_t aligned = 0;
  int64_t count = 0;
  int64_t max_aligned = 0;

  void Add(const Item& item) {
    cost += item.cost;
    aligned += item.aligned;
    ++count;
    if (item.aligned > max_aligned) max_aligned = item.aligned;
  }
};

// The cap and the per-part sequence limit. A cap of 0 means no cap.
class Capacity {
 public:
  Capacity() = default;
  Capacity(int64_t cap, CapMode mode, int64_t max_seqs)
      : cap_(cap), mode_(mode), max_seqs_(max_seqs) {}

  bool has_cap() const { return cap_ > 0; }
  int64_t cap() const { return cap_; }
  int64_t max_seqs() const { return max_seqs_; }
  CapMode mode() const { return mode_; }

  // The cap's measure of a part: aligned tokens, or count x longest aligned length.
  int64_t Measure(const PartLoad& load) const {
    return mode_ == CapMode::kTokens ? load.aligned : load.count * load.max_aligned;
  }
  // Whether a part with `load` breaks the cap or the sequence limit.
  bool Over(const PartLoad& load) const {
    return (max_seqs_ > 0 && load.count > max_seqs_) || (has_cap() && Measure(load) > cap_);
  }
  // Whether `load` plus one more sequence of aligned length `aligned` stays within both.
  bool Fits(const PartLoad& load, int64_t aligned) const {
    PartLoad next = load;
    next.aligned += aligned;
    ++next.count;
    if (aligned > next.max_aligned) next.max_aligned = aligned;
    return !Over(next);
  }
  // Whether one sequence alone breaks the cap.
  bool Overlong(int64_t aligned) const { return has_cap() && aligned > cap_; }

 private:
  int64_t cap_ = 0;
  CapMode mode_ = CapMode::kTokens;
  int64_t max_seqs_ = 0;
};

// Loads of every part of `parts` over `items`.
std::vector<PartLoad> LoadsOf(const Parts& parts, absl::Span<const Item> items);

// Whether every part of `parts` stays within `capacity`.
bool WithinCapacity(const Parts& parts, absl::Span<const Item> items, const Capacity& capacity);

// The largest part cost (0 for no parts).
int64_t MaxCost(const Parts& parts, absl::Span<const Item> items);

// Validated input: kept items in original order, isolated overlong items, dropped indices.
struct Validated {
  PlanOptions options;
  int64_t num_sequences = 0;
  Capacity capacity;
  std::vector<Item> items;     // planned normally, original order
  std::vector<Item> isolated;  // overlong under kIsolate: one part each
  std::vector<int64_t> dropped;
  int64_t total_tokens = 0;  // real tokens of items + isolated
};

// Checks `lengths` and `options` against the documented rules and limits (see planner.h) and
// splits the input by the overlong policy. `cap_required`: max_token_len must be >= 1.
// `balancing`: options.algorithm must be kk or lpt (else it must be a packer).
// `costs`: empty (each cost from the options' cost model), or one cost per length, each in
// [0, 2^62], used as given (tree pieces: tree_plan.h); their total must fit int64.
absl::StatusOr<Validated> Validate(absl::Span<const int64_t> lengths, const PlanOptions& options,
                                   bool cap_required, bool balancing,
                                   absl::Span<const int64_t> costs = {});

}  // namespace packsched::planner::internal

#endif  // PACKSCHED_SERVER_PLANNER_PREPARED_H_
