#ifndef PACKSCHED_SERVER_SERVICE_HEALTH_PROBE_H_
#define PACKSCHED_SERVER_SERVICE_HEALTH_PROBE_H_

// A grpc.health.v1 client for probes that cannot reach the sidecar's loopback port themselves
// (Kubernetes' grpc probes dial the pod IP): `packsched-server --probe=127.0.0.1:50051` runs it
// inside the pod, in plaintext or, for a server that speaks TLS, over TLS. No generated health
// stubs (Debian's gRPC ships none): the request and the response are one field each, encoded
// here.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"

namespace packsched::service {

// HealthCheckResponse.ServingStatus.
enum class Serving { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// How the probe speaks TLS (PEM file paths).
struct ProbeTls {
  std::string root_certs_file;  // the CA that signed the server's certificate (required)
  // A client certificate and its key, for a server that requires one (--tls_client_ca); both
  // or neither.
  std::string cert_file;
  std::string key_file;
  // The name the server's certificate must carry; empty: the host of the target.
  std::string server_name;
};

// The health of `service` at `target` ("" = the server as a whole, i.e. liveness;
// "packsched.v1.Scheduler" = readiness: the rank group has formed). Errors: the call's own
// (Unavailable when nothing listens, NotFound for a service the server does not know,
// DeadlineExceeded; a TLS handshake failure is Unavailable), InvalidArgument for a service name
// of 128 bytes or more or an unreadable `tls` file, Internal for a malformed response.
// Plaintext when `tls` is null.
// The channel a probe (or `--status`) uses: plaintext when `tls` is null, else TLS as above.
// InvalidArgument for an unreadable `tls` file or a missing root certificate.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ProbeChannel(const std::string& target,
                                                            const ProbeTls* tls);

absl::StatusOr<Serving> CheckHealth(const std::string& target, absl::string_view service,
                                    absl::Time deadline, const ProbeTls* tls = nullptr);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_HEALTH_PROBE_H_
