#include "server/sidecar/metrics.h"

#include <utility>

#include "server/base/address.h"
#include "server/base/status_macros.h"
#include "server/service/round_types.h"
#include "server/sidecar/process.h"
#include "spdlog/spdlog.h"

namespace packsched::sidecar {

metrics::Snapshot SnapshotOf(const service::RoundCoordinator::Stats& stats,
                             const collective::CountingStore* store) {
  metrics::Snapshot s;
  for (const service::RoundCoordinator::StreamStats& stream : stats.streams) {
    s.rounds_running += stream.running;
    s.rounds_queued += stream.outstanding - stream.running;
    s.cache_entries += stream.cached;
  }
  s.streams = static_cast<int64_t>(stats.streams.size());
  s.streams_reclaimed = stats.streams_reclaimed;
  s.cache_bytes = stats.cached_bytes;
  s.cache_hits = stats.cache_hits;
  s.joined = stats.joined_in_flight;
  s.world_size = stats.world_size;
  s.group_ready = stats.group_ready;
  s.generation = stats.generation;
  s.backend = stats.backend;
  // A group of one has no store: its counts stay 0.
  const collective::StoreRequests r =
      store != nullptr ? store->requests() : collective::StoreRequests();
  s.store_requests = {{"set", r.set},
                      {"get", r.get},
                      {"try_get", r.try_get},
                      {"compare_and_set", r.compare_and_set},
                      {"delete_prefix", r.delete_prefix}};
  return s;
}

std::unique_ptr<metrics::SidecarMetrics> MakeMetrics(const MetricsFlags& flags,
                                                     const service::ServerOptions& options) {
  if (flags.listen.empty()) return nullptr;
  metrics::SidecarMetrics::Options o;
  o.version = options.build_version;
  o.proto_version = service::kProtocolVersion;
  o.rank = options.rank;
  return std::make_unique<metrics::SidecarMetrics>(o);
}

absl::StatusOr<std::unique_ptr<metrics::MetricsEndpoint>> ServeMetrics(
    const MetricsFlags& flags, metrics::SidecarMetrics& metrics,
    const service::SchedulerServer& server, const collective::CountingStore* store) {
  metrics.SetSnapshotSource([&server, store] { return SnapshotOf(server.GetStats(), store); });
  ASSIGN_OR_RETURN(std::unique_ptr<metrics::MetricsEndpoint> endpoint,
                   metrics::MetricsEndpoint::Start(flags.listen, metrics));
  if (!flags.port_file.empty()) RETURN_IF_ERROR(WritePortFile(flags.port_file, endpoint->port()));
  // The address as bound, with the chosen port for port 0.
  const std::string& address = endpoint->address();
  if (IsLoopbackAddress(address)) {
    spdlog::info("serving metrics at http://{}/metrics", address);
  } else {
    spdlog::warn(
        "serving metrics at http://{}/metrics off loopback: the endpoint is unauthenticated and "
        "unencrypted; admit only the scraper (e.g. a NetworkPolicy)",
        address);
  }
  return endpoint;
}

}  // namespace packsched::sidecar
