#ifndef PACKSCHED_SERVER_COLLECTIVE_COLLECTIVE_H_
#define PACKSCHED_SERVER_COLLECTIVE_COLLECTIVE_H_

// The collective a sidecar group uses to agree on each round: a fixed-size all-reduce on the
// common path, and a fixed-size all-gather only to explain a failure (docs/design.md §3).
// Backends: LocalCollective (a group of one), Gloo (TCP, CPU) and NCCL (GPU). The rank group
// that forms them and agrees rounds over them is server/group/.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace packsched::collective {

enum class ReduceOp { kMax, kMin, kSum };

// The longest record (in words) a caller gathers with AllGather: a backend may size its buffers
// for world_size of them up front, so that the failure path allocates nothing. (The round's
// explanation of a failure, docs/design.md §3, gathers exactly this much: round.h.)
inline constexpr int kMaxGatheredRecordWords = 43;

// op(a, b). Sums wrap (callers bound their sums; wrapping keeps every rank's result identical
// rather than invoking undefined behaviour).
inline int64_t Reduce(ReduceOp op, int64_t a, int64_t b) {
  switch (op) {
    case ReduceOp::kMax:
      return a > b ? a : b;
    case ReduceOp::kMin:
      return a < b ? a : b;
    case ReduceOp::kSum:
      break;
  }
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// One rank's handle on a formed group.
//
// Every rank must make the same sequence of calls with the same sizes and ops; a rank that
// makes a different call, or none, leaves its peers waiting until their deadline.
// Thread-safety: AllReduce and AllGather are called by one thread at a time (a stream's worker);
// Abort() may be called from any thread at any time.
class Collective {
 public:
  virtual ~Collective() = default;

  virtual int64_t rank() const = 0;               // in [0, world_size())
  virtual int64_t world_size() const = 0;         // >= 1
  virtual absl::string_view backend() const = 0;  // "local", "gloo", "nccl"

  // In place: values[i] becomes op[i] over every rank's values[i]. Each element has its own op,
  // so one call reduces a whole record (a backend may split it into one collective per op).
  // Sums must not overflow int64 (callers bound what they contribute).
  // REQUIRES: ops.size() == values.size().
  // Returns DeadlineExceeded if the group has not completed the call by `deadline` (naming the
  // ranks that did not arrive when the backend knows them), Aborted if a peer failed or Abort()
  // was called; the group is then unusable and must be formed again. `values` is unspecified
  // after an error.
  virtual absl::Status AllReduce(absl::Span<int64_t> values, absl::Span<const ReduceOp> ops,
                                 absl::Time deadline) = 0;

  // out[r * record.size() + j] = rank r's record[j], for every rank r (rank-major).
  // REQUIRES: every rank passes the same record.size(); out.size() == world_size() *
  // record.size(). Errors as AllReduce.
  virtual absl::Status AllGather(absl::Span<const int64_t> record, absl::Span<int64_t> out,
                                 absl::Time deadline) = 0;

  // Makes every call in flight or later fail with Aborted, here; peers see their own failure
  // (Aborted or DeadlineExceeded). Idempotent, thread-safe.
  virtual void Abort() = 0;
};

}  // namespace packsched::collective

#endif  // PACKSCHED_SERVER_COLLECTIVE_COLLECTIVE_H_
