#ifndef PACKSCHED_SERVER_SIDECAR_FLAGS_H_
#define PACKSCHED_SERVER_SIDECAR_FLAGS_H_

// The flags of packsched-server (every one is defined in flags.cc; `--helpfull` lists them) and
// the options they turn into: the server's, the rank group's, the probe's, the status command's
// and the metrics endpoint's, as given. CheckFlags (flag_checks.h) checks every value first;
// StartRankGroup, RunProbe, RunStatus and ServeMetrics still check what they are handed.

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/service/server.h"
#include "server/sidecar/metrics.h"
#include "server/sidecar/probe.h"
#include "server/sidecar/rank_group.h"
#include "server/sidecar/status.h"

// The process's own flags, read by main.cc.
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(absl::Duration, shutdown_grace);

namespace packsched::sidecar {

// --listen, TLS, --auth_token_file (read here), the limits and the gRPC settings. Returns
// InvalidArgument naming --auth_token_file when the file cannot be read or is empty (it may
// have changed since CheckFlags). REQUIRES: CheckFlags() passed.
absl::StatusOr<service::ServerOptions> ServerOptionsFromFlags();

// --rank, --world_size, --rendezvous*, --backend, --gloo_*, --local_gpu.
RankGroupFlags RankGroupFlagsFromFlags();

// --probe, --probe_service, --probe_tls_* and the server's --tls_* flags.
ProbeFlags ProbeFlagsFromFlags();

// --status, --status_json, the probe's TLS flags and --auth_token_file.
StatusFlags StatusFlagsFromFlags();

// --metrics_listen, --metrics_port_file.
MetricsFlags MetricsFlagsFromFlags();

}  // namespace packsched::sidecar

#endif  // PACKSCHED_SERVER_SIDECAR_FLAGS_H_
