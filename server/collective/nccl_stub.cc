// The NCCL backend's stand-in for builds without PACKSCHED_WITH_NCCL: nothing to form, no GPU.

#include "server/collective/nccl_collective.h"

namespace packsched::collective {

bool NcclBuilt() { return false; }
bool GpuAvailable() { return false; }

struct NcclCollective::Impl {};

NcclCollective::NcclCollective(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclCollective::~NcclCollective() = default;

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Create(
    KeyValueStore& store, absl::string_view prefix, int64_t rank, int64_t world_size,
    const NcclOptions& options, absl::Time deadline) {
  return absl::UnimplementedError("nccl: this build has no NCCL backend (PACKSCHED_WITH_NCCL)");
}

int64_t NcclCollective::rank() const { return 0; }
int64_t NcclCollective::world_size() const { return 1; }

absl::Status NcclCollective::AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                                       absl::Time deadline) {
  return absl::UnimplementedError("nccl: not built");
}

absl::Status NcclCollective::AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                                       absl::Time deadline) {
  return absl::UnimplementedError("nccl: not built");
}

void NcclCollective::Abort() {}

}  // namespace packsched::collective
