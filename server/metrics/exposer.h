#ifndef PACKSCHED_SERVER_METRICS_EXPOSER_H_
#define PACKSCHED_SERVER_METRICS_EXPOSER_H_

// Serves the sidecar's metrics at GET /metrics over plain HTTP. Unauthenticated and
// unencrypted: keep it on loopback unless a scraper elsewhere needs it, and then admit only the
// scraper (docs/operating.md#metrics).
//
// One thread serves every connection from one poll loop, so a connection that sends nothing, or
// trickles its request, holds no worker: each has `request_timeout` from its accept to send its
// request and read the answer, and when `max_connections` are open the oldest is closed for a
// new one. Each answer is one request (Connection: close). The exposition is built at most once
// per `cache_interval` and every scrape in between is answered from that copy, so a scrape storm
// costs the sidecar the bytes it writes, not the collection.

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/metrics/sidecar_metrics.h"

namespace packsched::metrics {

class MetricsEndpoint {
 public:
  struct Options {
    int max_connections = 64;
    absl::Duration request_timeout = absl::Seconds(2);
    absl::Duration cache_interval = absl::Seconds(1);
  };

  // Listens on `listen` (one HOST:PORT or [V6]:PORT; port 0 picks a free port: see
  // listen_socket.h) and serves `metrics`, which must outlive the endpoint. InvalidArgument for
  // an address that is not one HOST:PORT, Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& listen,
                                                                const SidecarMetrics& metrics,
                                                                const Options& options);
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& listen,
                                                                const SidecarMetrics& metrics) {
    return Start(listen, metrics, Options());
  }
  // Stops serving: open connections are closed, answered or not.
  ~MetricsEndpoint();

  // The bound port.
  int port() const { return port_; }
  // The bound address, numeric: "127.0.0.1:9464", "[::1]:9464".
  const std::string& address() const { return address_; }

 private:
  class Loop;
  MetricsEndpoint(std::unique_ptr<Loop> loop, int port, std::string address);
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  int port_;
  std::string address_;
};

}  // namespace packsched::metrics

#endif  // PACKSCHED_SERVER_METRICS_EXPOSER_H_
