#ifndef PACKSCHED_SERVER_COLLECTIVE_GLOO_FORMATION_H_
#define PACKSCHED_SERVER_COLLECTIVE_GLOO_FORMATION_H_

// Internal to the Gloo backend (gloo_collective.h): forming a rank's member of a group. A
// sidecar forms under kRecursiveDoubling (FormPeers, here): each rank connects only to its
// RecursiveDoublingPeers, a watchdog ends the formation at its deadline or on cancellation, and
// a failed formation names the rank at fault. Gloo's own full mesh, for its comparison-only
// algorithms, is gloo_full_mesh.h.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gloo/context.h"
#include "gloo/transport/device.h"
#include "server/collective/cancellation.h"
#include "server/collective/gloo_collective.h"
#include "server/collective/recursive_doubling.h"
#include "server/collective/store.h"

namespace packsched::collective::internal {

// What a formation left.
struct GlooFormation {
  std::shared_ptr<gloo::Context> context;  // closed when dropped
  // kRecursiveDoubling: the round's all-reduce over buffers registered with each partner.
  std::shared_ptr<BoundRecursiveDoubling> bound;
  absl::Status connected;      // OK, or the formation's failure (naming the rank at fault)
  absl::Status store_failure;  // the store's own failure, if formation stopped on one
  bool cancelled = false;      // `cancel` ended it: nobody is at fault
};

// Forms under kRecursiveDoubling (GlooCollective::Create's contract), with `device`.
GlooFormation FormPeers(KeyValueStore& store, absl::string_view prefix, int64_t rank,
                        int64_t world_size, std::shared_ptr<gloo::transport::Device>& device,
                        const GlooOptions& options, absl::Time deadline, Cancellation* cancel);

}  // namespace packsched::collective::internal

#endif  // PACKSCHED_SERVER_COLLECTIVE_GLOO_FORMATION_H_
