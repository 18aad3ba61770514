// packsched-server: the scheduler sidecar. Flags -> options -> rank group -> gRPC server -> wait
// for SIGTERM/SIGINT -> graceful shutdown. With no group flags the server is a group of one.
//
//   server/sidecar/flags.*        every flag, and the options they turn into
//   server/sidecar/rank_group.*   the rendezvous store (served by rank 0), its client, the Group,
//                                 the agreements the server is handed, the readiness watch
//   server/sidecar/probe.*        --probe: one health check, for exec probes
//   server/sidecar/status.*       --status: GetStatus as a table or JSON
//   server/sidecar/metrics.*      --metrics_listen: Prometheus metrics at /metrics
//   server/sidecar/process.*      signals and --port_file
//   server/sidecar/command_line.* parsing the flags: --help, --version, exit codes
//   server/sidecar/flag_checks.*  every flag's value checked before anything starts

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/base/logging.h"
#include "server/service/server.h"
#include "server/sidecar/command_line.h"
#include "server/sidecar/flag_checks.h"
#include "server/sidecar/flags.h"
#include "server/sidecar/probe.h"
#include "server/sidecar/process.h"
#include "server/sidecar/rank_group.h"
#include "spdlog/spdlog.h"

namespace {

int Fail(const absl::Status& status) {
  spdlog::error("{}", status.ToString());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  namespace sidecar = packsched::sidecar;
#ifdef NDEBUG
  // Debian's Abseil is built without NDEBUG, so by default every absl::Mutex (gRPC's own locks
  // included) keeps a process-wide lock-order graph to detect deadlocks: a cost on every lock
  // taken while another is held. Off in optimised builds; debug builds keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  if (const std::optional<int> exit_code = sidecar::ParseCommandLine(argc, argv)) {
    return *exit_code;
  }
  // Every flag, before anything is started or written: a usage error is one line and exit 2.
  if (const absl::Status s = sidecar::CheckFlags(); !s.ok()) {
    std::fprintf(stderr, "packsched-server: %s\n", std::string(s.message()).c_str());
    return sidecar::kUsageError;
  }
  if (absl::Status s = packsched::InitLogging("packsched-server", absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    std::fprintf(stderr, "packsched-server: --log_level: %s\n", s.ToString().c_str());
    return sidecar::kUsageError;
  }
  if (const sidecar::ProbeFlags probe = sidecar::ProbeFlagsFromFlags(); !probe.target.empty()) {
    return sidecar::RunProbe(probe);
  }
  if (const sidecar::StatusFlags status = sidecar::StatusFlagsFromFlags(); !status.target.empty()) {
    return sidecar::RunStatus(status);
  }
  if (absl::Status s = sidecar::InstallSignalHandlers(); !s.ok()) return Fail(s);
  absl::StatusOr<packsched::service::ServerOptions> options = sidecar::ServerOptionsFromFlags();
  // A flag's value refused by its check is a usage error, like one that does not parse.
  if (!options.ok()) {
    Fail(options.status());
    return options.status().code() == absl::StatusCode::kInvalidArgument ? sidecar::kUsageError : 1;
  }

  const sidecar::RankGroupFlags group_flags = sidecar::RankGroupFlagsFromFlags();
  absl::StatusOr<sidecar::RankGroup> group = sidecar::StartRankGroup(group_flags, *options);
  if (!group.ok()) return Fail(group.status());
  sidecar::AttachRankGroup(*group, *options);
  // Made before the server, which records into them; served once it runs (metrics.h).
  const sidecar::MetricsFlags metrics_flags = sidecar::MetricsFlagsFromFlags();
  std::unique_ptr<packsched::metrics::SidecarMetrics> metrics =
      sidecar::MakeMetrics(metrics_flags, *options);
  options->metrics = metrics.get();

  // Serves before the group has formed: each stream forms it on its first round, waiting for
  // the peers at most --collective_timeout.
  absl::StatusOr<std::unique_ptr<packsched::service::SchedulerServer>> server =
      packsched::service::SchedulerServer::Start(*options);
  if (!server.ok()) return Fail(server.status());
  const int port = (*server)->port();
  std::unique_ptr<packsched::metrics::MetricsEndpoint> metrics_endpoint;
  if (metrics != nullptr) {
    absl::StatusOr<std::unique_ptr<packsched::metrics::MetricsEndpoint>> served =
        sidecar::ServeMetrics(metrics_flags, *metrics, **server, group->counted.get());
    if (!served.ok()) return Fail(served.status());
    metrics_endpoint = *std::move(served);
  }
  // Last: the port file says that everything asked for is served (a metrics address that cannot
  // be bound fails the start before it exists).
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    if (absl::Status s = sidecar::WritePortFile(path, port); !s.ok()) return Fail(s);
  }
  spdlog::info("serving packsched.v1.Scheduler on {} (port {}){}{}; rank {} of {}{}{}",
               options->listen, port, options->tls_cert.empty() ? "" : ", TLS",
               options->auth_token.empty() ? "" : ", bearer token required", options->rank,
               group_flags.world_size, group_flags.rendezvous.empty() ? "" : ", rendezvous ",
               group_flags.rendezvous);

  sidecar::WaitForSignal();
  const absl::Duration grace = absl::GetFlag(FLAGS_shutdown_grace);
  spdlog::info("shutting down (grace {})", absl::FormatDuration(grace));
  (*server)->Shutdown(grace);
  // Every call, round and collective has ended. The process exits without tearing down what is
  // left (the metrics endpoint, the gRPC server, the coordinator, the rank group and rank 0's
  // store): gRPC's server
  // destructor can wait seconds for its internal threads (6.5 s in 1 of 4 shutdowns right after
  // a 190 MB plan), which would break the grace, and nothing it would release outlives the
  // process — its sockets close with it, as after a kill. (Tests tear SchedulerServer down
  // in order.)
  spdlog::info("stopped");
  spdlog::shutdown();
  std::_Exit(0);
}
