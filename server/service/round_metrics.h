#ifndef PACKSCHED_SERVER_SERVICE_ROUND_METRICS_H_
#define PACKSCHED_SERVER_SERVICE_ROUND_METRICS_H_

// What one round the coordinator ran tells the metrics sink (server/metrics/sink.h). Called by
// the coordinator only when metrics are on.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/group/round_agreement.h"
#include "server/metrics/sink.h"
#include "server/service/round_types.h"

namespace packsched::service {

// The sample of round `round` of `stream`, which took `took` on its worker and ended with
// `result`; `agreement` is the stream's (null before it has one), read for its formations.
// The sample's `stream` refers to `stream`.
metrics::RoundSample RoundSampleOf(absl::string_view stream, int64_t round,
                                   const absl::StatusOr<std::shared_ptr<const RoundResult>>& result,
                                   absl::Duration took, const group::RoundAgreement* agreement);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_ROUND_METRICS_H_
