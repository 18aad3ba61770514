#ifndef PACKSCHED_SERVER_SERVICE_HEALTH_PROBE_H_
#define PACKSCHED_SERVER_SERVICE_HEALTH_PROBE_H_

// A grpc.health.v1 client for probes that cannot reach the sidecar's loopback port themselves
// (Kubernetes' grpc probes dial the pod IP): `packsched-server --probe=127.0.0.1:50051` runs it
// inside the pod. Plaintext only. No generated health stubs (Debian's gRPC ships none): the
// request and the response are one field each, encoded here.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace packsched::service {

// HealthCheckResponse.ServingStatus.
enum class Serving { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// The health of `service` at `target` ("" = the server as a whole, i.e. liveness;
// "packsched.v1.Scheduler" = readiness: the rank group has formed). Errors: the call's own
// (Unavailable when nothing listens, NotFound for a service the server does not know,
// DeadlineExceeded), InvalidArgument for a service name of 128 bytes or more, Internal for a
// malformed response.
absl::StatusOr<Serving> CheckHealth(const std::string& target, absl::string_view service,
                                    absl::Time deadline);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_HEALTH_PROBE_H_
