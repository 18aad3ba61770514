#ifndef PACKSCHED_SERVER_SERVICE_SERVER_H_
#define PACKSCHED_SERVER_SERVICE_SERVER_H_

// The sidecar's gRPC server: the Scheduler service with its round coordinator, the standard
// grpc.health.v1 service and server reflection, TLS and the bearer token (server/security/
// credentials.h), and the gRPC-level limits (message size, concurrent streams, resource quota).
// server/sidecar/flags.cc fills the options from flags and server/sidecar/rank_group.h gives it
// the agreement port; tests can run it in process.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/group/round_agreement.h"
#include "server/metrics/sink.h"
#include "server/service/coordinator.h"
#include "server/service/limits.h"

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
  // The service's own workers for BalanceBatch and Partition (work_pool.h); 0 =
  // WorkPool::DefaultThreads(). At most planning_queue requests wait for one.
  int64_t planning_threads = 0;
  int64_t planning_queue = 8;
  int64_t rank = 0;
  std::string build_version;
  // How the rounds are agreed with the peers (RoundCoordinator::Options::agreements): the rank
  // group's or a group of one's. Required. Its serving listener sets the Scheduler's health
  // status (readiness) while the server runs.
  std::shared_ptr<group::RoundAgreements> agreements;
  // Ends the rank group's blocking store waits at shutdown (RoundCoordinator::Options).
  std::function<void()> cancel_group_waits;
  // Where calls and rounds are recorded (server/metrics/sink.h): not owned, outlives the
  // server. Null: metrics off.
  metrics::Sink* metrics = nullptr;
  // The collective backend as configured: "local" for a group of one; "gloo", "nccl" or "auto"
  // for a rank group. GetStatus and the metrics report it until a stream has formed its
  // collective, then the backend that stream agreed (RoundCoordinator::Options::backend).
  std::string backend = "local";
};

class SchedulerServer {
 public:
  // Builds and starts the server. Returns InvalidArgument for unreadable TLS files, a key that
  // is not its certificate's (naming both files) or without agreements, FailedPrecondition for
  // a token without TLS on a non-loopback address, ResourceExhausted when the system refuses a
  // planning worker thread, Unavailable if it cannot bind.
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(const ServerOptions& options);

  ~SchedulerServer();  // Shutdown(absl::ZeroDuration()) if not done.

  // The bound port (the chosen one when the listen port was 0).
  int port() const;

  // The round coordinator's figures (what GetStatus reports). Thread-safe.
  RoundCoordinator::Stats GetStats() const;

  // Refuses new calls (UNAVAILABLE, not marked as served) and lets calls in progress finish for
  // up to `grace`; returns as soon as none is left (connected clients, idle ones included, do not
  // hold it). Rounds still outstanding shortly before the grace period ends (a quarter of it, at
  // most 500 ms, before) are failed by the coordinator (RoundCoordinator::Shutdown: Aborted /
  // Unavailable, with the service's served marker, so clients do not retry them); whatever call
  // is left at `grace` is cancelled. Returns when everything has ended. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  struct State;
  explicit SchedulerServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_SERVER_H_
