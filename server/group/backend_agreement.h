#ifndef PACKSCHED_SERVER_GROUP_BACKEND_AGREEMENT_H_
#define PACKSCHED_SERVER_GROUP_BACKEND_AGREEMENT_H_

// What `--backend=auto` resolves to, agreed by the rank group through the rendezvous store
// (group_keys.h): NCCL only if every rank can use it, else Gloo.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/collective/backend.h"
#include "server/collective/store.h"

namespace packsched::group {

// Agrees on kGloo or kNccl for --backend=auto among `world_size` ranks, through `epoch_root` in
// `store`: every rank publishes whether it can use NCCL; rank 0 decides (NCCL only if every rank
// can; it reads the W answers only when it can itself) and publishes the decision, which the
// others read. O(W) store operations in all, once per run epoch. Returns DeadlineExceeded if
// a rank has not answered (rank 0) or the decision is not published (others) by `deadline`.
absl::StatusOr<collective::Backend> AgreeOnBackend(collective::KeyValueStore& store,
                                                   absl::string_view epoch_root, int64_t rank,
                                                   int64_t world_size, bool can_use_nccl,
                                                   absl::Time deadline);

}  // namespace packsched::group

#endif  // PACKSCHED_SERVER_GROUP_BACKEND_AGREEMENT_H_
