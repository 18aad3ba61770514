#ifndef PACKSCHED_SERVER_SERVICE_SERVER_H_
#define PACKSCHED_SERVER_SERVICE_SERVER_H_

// The sidecar's gRPC server: the Scheduler service with its round coordinator, the standard
// grpc.health.v1 service and server reflection, TLS and the bearer token, and the gRPC-level
// limits (message size, concurrent streams, resource quota). server/main.cc fills the options
// from flags; tests can run it in process.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/group/group.h"
#include "server/service/coordinator.h"
#include "server/service/limits.h"

namespace grpc {
class ServerCredentials;
}  // namespace grpc

namespace packsched::service {

struct ServerOptions {
  // host:port to listen on; port 0 picks a free port (see SchedulerServer::port()).
  std::string listen = "127.0.0.1:50051";
  // PEM file paths. With tls_cert and tls_key the server speaks TLS only; with tls_client_ca
  // too, clients must present a certificate signed by it.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Bearer token every call must carry; empty = none. Accepted only over TLS or on a loopback
  // listen address.
  std::string auth_token;
  ServiceLimits limits;
  int64_t max_receive_message_bytes = int64_t{64} << 20;
  int64_t max_concurrent_streams = 256;  // per connection
  int64_t resource_quota_bytes = int64_t{1} << 30;
  int64_t max_threads = 64;  // gRPC threads (resource quota)
  int64_t rank = 0;
  std::string build_version;
  // The rank group (not owned; outlives the server), or null for a group of one.
  group::Group* group = nullptr;
  // Ends the rank group's blocking store waits at shutdown (RoundCoordinator::Options).
  std::function<void()> cancel_group_waits;
};

class SchedulerServer {
 public:
  // Builds and starts the server. Returns InvalidArgument for unreadable TLS files or a token
  // without TLS on a non-loopback address (FailedPrecondition), Unavailable if it cannot bind.
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(const ServerOptions& options);

  ~SchedulerServer();  // Shutdown(absl::ZeroDuration()) if not done.

  // The bound port (the chosen one when the listen port was 0).
  int port() const;

  // Stops accepting calls and lets calls in progress finish for up to `grace`. Rounds still
  // outstanding shortly before the grace period ends (a quarter of it, at most 500 ms, before)
  // are failed by the coordinator (RoundCoordinator::Shutdown: Aborted / Unavailable, with the
  // service's served marker, so clients do not retry them); gRPC then cancels whatever call is
  // left at `grace`. Returns when everything has ended. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  struct State;
  explicit SchedulerServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// True when `a` and `b` are equal; the time taken depends only on their lengths (bearer tokens).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// The scheme of the `authorization` metadata value: "Bearer <token>".
inline constexpr absl::string_view kBearerPrefix = "Bearer ";

// Checks a call's `authorization` metadata value (nullopt when the call sent none) against the
// server's bearer `token`; every call passes when `token` is empty. Returns Unauthenticated for a
// missing or wrong token (compared in constant time). Both the Scheduler and the Rendezvous
// services use it.
absl::Status CheckBearerToken(std::optional<absl::string_view> authorization,
                              absl::string_view token);

// Insecure credentials without files; TLS with `tls_cert` + `tls_key`, requiring client
// certificates signed by `tls_client_ca` when that is set. InvalidArgument names the flag of an
// unreadable file or a missing partner. (The Scheduler and the Rendezvous ports share it.)
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(
    const std::string& tls_cert, const std::string& tls_key, const std::string& tls_client_ca);

// The contents of a PEM (or any) file; InvalidArgument naming `flag` if it cannot be read.
absl::StatusOr<std::string> ReadPemFile(absl::string_view flag, const std::string& path);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_SERVER_H_
