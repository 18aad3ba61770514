#ifndef PACKSCHED_SERVER_SERVICE_LIMITS_H_
#define PACKSCHED_SERVER_SERVICE_LIMITS_H_

// Bounds on everything a request can make the sidecar allocate. Each has a server flag of the
// same name (server/sidecar/flags.cc); exceeding one is RESOURCE_EXHAUSTED naming the limit.

#include <cstdint>

#include "absl/time/time.h"
#include "server/planner/options.h"

namespace packsched::service {

struct ServiceLimits {
  // Sequences in one Plan / Partition / BalanceBatch request.
  int64_t max_sequences_per_request = int64_t{1} << 20;
  // Ceiling on a request's max_micro_batches (and its default when the request leaves it 0).
  int64_t max_micro_batches = planner::kDefaultMaxMicroBatches;
  // Live streams one sidecar keeps: a stream exists once a valid request made it, and is
  // reclaimed after stream_idle_timeout.
  int64_t max_streams = 64;
  // A stream with no round queued or running and no call for this long is reclaimed with its
  // worker thread (coordinator.h); zero: never.
  absl::Duration stream_idle_timeout = absl::Minutes(30);
  // Finished rounds kept per stream for late callers of the same round (TP/PP/CP ranks); 0 keeps
  // none, so every late caller is refused (see max_cached_bytes).
  int64_t max_cached_rounds = 16;
  // Estimated bytes of the finished rounds kept for late callers, over every stream; the oldest
  // go first. A result larger than this on its own is served but not kept. (A late caller of a
  // round that is no longer kept gets FAILED_PRECONDITION: a served round is never run again.)
  // Counted apart from max_inflight_bytes: a sidecar's memory is about its baseline (~25 MiB)
  // + max_cached_bytes + max_inflight_bytes (docs/operating.md, sizing).
  int64_t max_cached_bytes = int64_t{128} << 20;
  // Estimated peak bytes of the requests being served at once (request_memory.h, RequestMemory;
  // memory_budget.h): a request that would exceed it is refused with RESOURCE_EXHAUSTED before
  // anything sized by it is allocated. 0 = no budget.
  int64_t max_inflight_bytes = int64_t{320} << 20;
  // Rounds queued or running per stream.
  int64_t max_outstanding_rounds = 64;
  // Longest stream name, bytes.
  int64_t max_stream_name = 128;
  // Bound on every server-side wait of a round (forming the group, the collective).
  absl::Duration collective_timeout = absl::Seconds(60);
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_LIMITS_H_
