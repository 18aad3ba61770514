#ifndef PACKSCHED_SERVER_COLLECTIVE_BACKEND_H_
#define PACKSCHED_SERVER_COLLECTIVE_BACKEND_H_

// Choosing and forming a backend: `--backend=auto|gloo|nccl|local` and the one call that forms
// any backend under a prefix. (What auto resolves to is agreed by the rank group:
// server/group/backend_agreement.h.)

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/collective/cancellation.h"
#include "server/collective/collective.h"
#include "server/collective/gloo_collective.h"
#include "server/collective/nccl_collective.h"
#include "server/collective/store.h"

namespace packsched::collective {

enum class Backend { kAuto, kGloo, kNccl, kLocal };

// "auto", "gloo", "nccl", "local"; anything else is InvalidArgument naming the choices.
absl::StatusOr<Backend> ParseBackend(absl::string_view name);
absl::string_view BackendName(Backend backend);

// Whether this process can be an NCCL rank: built with NCCL and sees a GPU.
bool CanUseNccl();

// Forms `backend` (kGloo, kNccl or kLocal; not kAuto) for `rank` of `world_size` under the fresh
// `prefix`. kLocal requires world_size == 1. Errors as the backend's Create. `cancel` (optional)
// ends a Gloo formation early with Aborted (GlooCollective::Create); NCCL's formation does not
// take it and ends by `deadline` (its store waits end sooner when the store is cancelled).
absl::StatusOr<std::unique_ptr<Collective>> FormCollective(
    Backend backend, KeyValueStore& store, absl::string_view prefix, int64_t rank,
    int64_t world_size, const GlooOptions& gloo, const NcclOptions& nccl, absl::Time deadline,
    Cancellation* cancel = nullptr);

}  // namespace packsched::collective

#endif  // PACKSCHED_SERVER_COLLECTIVE_BACKEND_H_
