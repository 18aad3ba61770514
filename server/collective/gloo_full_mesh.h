#ifndef PACKSCHED_SERVER_COLLECTIVE_GLOO_FULL_MESH_H_
#define PACKSCHED_SERVER_COLLECTIVE_GLOO_FULL_MESH_H_

// Internal to the Gloo backend, for comparison only (GlooOptions::Algorithm: kBcube and kRing,
// used by tests and tests/bench/collective_bench.cc; a sidecar never forms one, and the rank
// group refuses them): Gloo's own full-mesh formation through our store, its bcube and ring
// all-reduce over a whole record, and its all-gather. Without the bounds a sidecar relies on:
// no formation watchdog, and a cancellation is checked only before formation starts.

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gloo/context.h"
#include "gloo/transport/device.h"
#include "server/collective/collective.h"
#include "server/collective/gloo_collective.h"
#include "server/collective/gloo_formation.h"
#include "server/collective/store.h"

namespace packsched::collective::internal {

// Gloo's full mesh (every rank connects to every other), its addresses through `store` under
// `prefix`. A peer that joined and went away before `deadline` is Aborted, as in a round.
GlooFormation FormFullMesh(KeyValueStore& store, absl::string_view prefix, int64_t rank,
                           int64_t world_size, std::shared_ptr<gloo::transport::Device>& device,
                           absl::Time deadline);

// Gloo's `algorithm` (kBcube or kRing) all-reduce of `ops.size()` words at `data`, each with its
// own op. Throws what Gloo throws (RunGloo turns it into a Status).
void FullMeshAllreduce(const std::shared_ptr<gloo::Context>& context, int64_t* data,
                       std::vector<ReduceOp> ops, GlooOptions::Algorithm algorithm,
                       std::chrono::milliseconds timeout);

// Gloo's all-gather of `words` words per rank from `in` into `out` (world_size records). Throws
// what Gloo throws.
void FullMeshAllgather(const std::shared_ptr<gloo::Context>& context, const int64_t* in,
                       size_t words, int64_t* out, std::chrono::milliseconds timeout);

}  // namespace packsched::collective::internal

#endif  // PACKSCHED_SERVER_COLLECTIVE_GLOO_FULL_MESH_H_
