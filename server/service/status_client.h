#ifndef PACKSCHED_SERVER_SERVICE_STATUS_CLIENT_H_
#define PACKSCHED_SERVER_SERVICE_STATUS_CLIENT_H_

// A GetStatus client for `packsched-server --status=HOST:PORT` (server/sidecar/status.h): one
// call, over the probe's channel (plaintext, or TLS as health_probe.h describes), with the
// sidecar's bearer token when it requires one.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "packsched/v1/scheduler.pb.h"
#include "server/service/health_probe.h"

namespace packsched::service {

// GetStatus of the sidecar at `target`, answered by `deadline`. `auth_token` (empty: none) is
// sent as a bearer token, only over TLS or to a loopback target (FailedPrecondition otherwise).
// Errors: the call's own (Unavailable when nothing listens, Unauthenticated, DeadlineExceeded),
// InvalidArgument for an unreadable `tls` file. Plaintext when `tls` is null.
absl::StatusOr<v1::GetStatusResponse> FetchStatus(const std::string& target, absl::Time deadline,
                                                  const ProbeTls* tls,
                                                  const std::string& auth_token);

// `status` as JSON for programs: the proto's own (snake_case) field names, every field (those
// at their default value included), integers as JSON numbers (int64 too), maps as objects with
// their keys sorted, enums by name. Not protobuf's JSON mapping (camelCase, int64 as strings).
std::string StatusJson(const v1::GetStatusResponse& status);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_STATUS_CLIENT_H_
