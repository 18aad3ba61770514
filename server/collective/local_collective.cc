#include "server/collective/local_collective.h"

#include <algorithm>

namespace packsched::collective {

absl::Status LocalCollective::AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                                        absl::Time deadline) {
  if (aborted_.load()) return absl::AbortedError("local collective: aborted");
  if (ops.size() != values.size()) {
    return absl::InvalidArgumentError("local collective: ops and values differ in size");
  }
  return absl::OkStatus();
}

absl::Status LocalCollective::AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                                        absl::Time deadline) {
  if (aborted_.load()) return absl::AbortedError("local collective: aborted");
  if (out.size() != record.size()) {
    return absl::InvalidArgumentError("local collective: out must hold one record");
  }
  std::copy(record.begin(), record.end(), out.begin());
  return absl::OkStatus();
}

}  // namespace packsched::collective
