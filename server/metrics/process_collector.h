#ifndef PACKSCHED_SERVER_METRICS_PROCESS_COLLECTOR_H_
#define PACKSCHED_SERVER_METRICS_PROCESS_COLLECTOR_H_

// The process's own CPU and memory, read from /proc at every scrape under the names of
// Prometheus' client libraries (prometheus-cpp 1.0 has no process collector):
// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_start_time_seconds, process_open_fds. Linux only; a file that cannot be read leaves
// its series out of that scrape.

#include <optional>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace packsched::metrics {

// What /proc/self/stat and /proc/stat say, in base units.
struct ProcessStat {
  double cpu_seconds = 0;  // user + system
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double start_time_seconds = 0;  // since the Unix epoch
};

// Reads this process's figures; nullopt if /proc cannot be read or parsed.
std::optional<ProcessStat> ReadProcessStat();

// Thread-safe (stateless).
class ProcessCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace packsched::metrics

#endif  // PACKSCHED_SERVER_METRICS_PROCESS_COLLECTOR_H_
