#include "server/metrics/exposer.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace packsched::metrics {

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer, int port)
    : exposer_(std::move(exposer)), port_(port) {}

MetricsEndpoint::~MetricsEndpoint() = default;

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, const SidecarMetrics& metrics) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen = '", listen, "': expected HOST:PORT (port 0: any free)"));
  }
  // prometheus-cpp reports a failure to bind by throwing (civetweb's CivetException): caught
  // here, the one place this library meets it.
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen = '", listen, "': cannot serve metrics: ", e.what()));
  }
  for (const std::weak_ptr<prometheus::Collectable>& c : metrics.collectables()) {
    exposer->RegisterCollectable(c);
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen = '", listen, "': no listening port"));
  }
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(exposer), ports[0]));
}

}  // namespace packsched::metrics
