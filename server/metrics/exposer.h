#ifndef PACKSCHED_SERVER_METRICS_EXPOSER_H_
#define PACKSCHED_SERVER_METRICS_EXPOSER_H_

// Serves the sidecar's metrics at GET /metrics over plain HTTP (prometheus-cpp's pull exposer,
// civetweb). Unauthenticated and unencrypted: keep it on loopback unless a scraper elsewhere
// needs it, and then admit only the scraper (docs/operating.md#metrics).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/metrics/sidecar_metrics.h"

namespace prometheus {
class Exposer;
}

namespace packsched::metrics {

class MetricsEndpoint {
 public:
  // Listens on `listen` (HOST:PORT, or [V6]:PORT; port 0 picks a free port) and serves
  // `metrics`, which must outlive the endpoint. InvalidArgument for an address without a port,
  // Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& listen,
                                                                const SidecarMetrics& metrics);
  // Stops serving (a scrape in progress completes first).
  ~MetricsEndpoint();

  // The bound port.
  int port() const { return port_; }

 private:
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer, int port);
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

}  // namespace packsched::metrics

#endif  // PACKSCHED_SERVER_METRICS_EXPOSER_H_
