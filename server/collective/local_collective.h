#ifndef PACKSCHED_SERVER_COLLECTIVE_LOCAL_COLLECTIVE_H_
#define PACKSCHED_SERVER_COLLECTIVE_LOCAL_COLLECTIVE_H_

// A group of one (world size 1): what a sidecar started without group flags uses. Every call
// completes at once; reductions and gathers are the identity.

#include <atomic>

#include "server/collective/collective.h"

namespace packsched::collective {

class LocalCollective final : public Collective {
 public:
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  absl::string_view backend() const override { return "local"; }

  // Leaves `values` as they are. Returns Aborted after Abort().
  absl::Status AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                         absl::Time deadline) override;
  // Copies `record` into `out`. Returns Aborted after Abort().
  absl::Status AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                         absl::Time deadline) override;
  void Abort() override { aborted_.store(true); }

 private:
  std::atomic<bool> aborted_{false};
};

}  // namespace packsched::collective

#endif  // PACKSCHED_SERVER_COLLECTIVE_LOCAL_COLLECTIVE_H_
