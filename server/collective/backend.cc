#include "server/collective/backend.h"

#include "absl/strings/str_cat.h"
#include "server/base/status_macros.h"
#include "server/collective/local_collective.h"

namespace packsched::collective {

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  if (name == "local") return Backend::kLocal;
  return absl::InvalidArgumentError(
      absl::StrCat("backend must be auto, gloo, nccl or local, got '", name, "'"));
}

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
    case Backend::kLocal:
      return "local";
  }
  return "unknown";
}

bool CanUseNccl() { return NcclBuilt() && GpuAvailable(); }

absl::StatusOr<std::unique_ptr<Collective>> FormCollective(
    Backend backend, KeyValueStore& store, absl::string_view prefix, int64_t rank,
    int64_t world_size, const GlooOptions& gloo, const NcclOptions& nccl, absl::Time deadline,
    Cancellation* cancel) {
  switch (backend) {
    case Backend::kLocal:
      if (world_size != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("the local backend is a group of one, not ", world_size));
      }
      return std::make_unique<LocalCollective>();
    case Backend::kGloo: {
      ASSIGN_OR_RETURN(std::unique_ptr<GlooCollective> formed,
                       GlooCollective::Create(store, absl::StrCat(prefix, "gloo/"), rank,
                                              world_size, gloo, deadline, cancel));
      return formed;
    }
    case Backend::kNccl: {
      ASSIGN_OR_RETURN(std::unique_ptr<NcclCollective> formed,
                       NcclCollective::Create(store, absl::StrCat(prefix, "nccl/"), rank,
                                              world_size, nccl, deadline));
      return formed;
    }
    case Backend::kAuto:
      break;
  }
  return absl::InvalidArgumentError("FormCollective needs a concrete backend, not auto");
}

}  // namespace packsched::collective
