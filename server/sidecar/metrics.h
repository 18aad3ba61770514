#ifndef PACKSCHED_SERVER_SIDECAR_METRICS_H_
#define PACKSCHED_SERVER_SIDECAR_METRICS_H_

// --metrics_listen: the sidecar's Prometheus metrics (server/metrics/), made before the server
// (the service and coordinator record into them) and served once the server runs (the
// scrape-time gauges read its coordinator).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/collective/counting_store.h"
#include "server/metrics/exposer.h"
#include "server/metrics/sidecar_metrics.h"
#include "server/service/server.h"

namespace packsched::sidecar {

// The flags of the metrics endpoint, as given (flags.h: MetricsFlagsFromFlags).
struct MetricsFlags {
  std::string listen;     // --metrics_listen; empty: metrics off
  std::string port_file;  // --metrics_port_file; empty: none
};

// The sidecar's metrics and their endpoint. Destroy the endpoint before the server it reads.
struct SidecarMetricsEndpoint {
  std::unique_ptr<metrics::SidecarMetrics> metrics;
  std::unique_ptr<metrics::MetricsEndpoint> endpoint;
};

// The metrics series, or null when --metrics_listen is empty; `options` gives the build info
// labels. Set ServerOptions::metrics to the result before starting the server.
std::unique_ptr<metrics::SidecarMetrics> MakeMetrics(const MetricsFlags& flags,
                                                     const service::ServerOptions& options);

// Serves `metrics` (not null) at flags.listen, its gauges reading `server` and `store` (the rank
// group's counted store, null for a group of one; both must outlive the returned endpoint), logs
// the bound address (and a warning off loopback: the endpoint is unauthenticated) and writes
// flags.port_file. Errors: MetricsEndpoint::Start's, and the port file's.
absl::StatusOr<std::unique_ptr<metrics::MetricsEndpoint>> ServeMetrics(
    const MetricsFlags& flags, metrics::SidecarMetrics& metrics,
    const service::SchedulerServer& server, const collective::CountingStore* store);

// The gauges' snapshot from the coordinator's figures and the store's requests (null: none).
metrics::Snapshot SnapshotOf(const service::RoundCoordinator::Stats& stats,
                             const collective::CountingStore* store);

}  // namespace packsched::sidecar

#endif  // PACKSCHED_SERVER_SIDECAR_METRICS_H_
