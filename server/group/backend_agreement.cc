#include "server/group/backend_agreement.h"

#include <string>

#include "server/base/status_macros.h"
#include "server/group/group_keys.h"

namespace packsched::group {

absl::StatusOr<collective::Backend> AgreeOnBackend(collective::KeyValueStore& store,
                                                   absl::string_view epoch_root, int64_t rank,
                                                   int64_t world_size, bool can_use_nccl,
                                                   absl::Time deadline) {
  const std::string decision_key = keys::Backend(epoch_root);
  if (rank != 0) {
    RETURN_IF_ERROR(
        store.Set(keys::NcclCapable(epoch_root, rank), can_use_nccl ? "1" : "0", deadline));
    ASSIGN_OR_RETURN(std::string decision, store.Get(decision_key, deadline));
    return collective::ParseBackend(decision);
  }
  bool all = can_use_nccl;
  for (int64_t r = 1; r < world_size && all; ++r) {
    absl::StatusOr<std::string> answer = store.Get(keys::NcclCapable(epoch_root, r), deadline);
    if (!answer.ok()) return answer.status();
    all = *answer == "1";
  }
  const collective::Backend decision =
      all ? collective::Backend::kNccl : collective::Backend::kGloo;
  RETURN_IF_ERROR(store.Set(decision_key, collective::BackendName(decision), deadline));
  return decision;
}

}  // namespace packsched::group
