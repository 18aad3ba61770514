#ifndef PACKSCHED_SERVER_METRICS_SIDECAR_METRICS_H_
#define PACKSCHED_SERVER_METRICS_SIDECAR_METRICS_H_

// The sidecar's Prometheus metrics (prometheus-cpp): every series the sidecar exports, named
// once in sidecar_metrics.cc and listed with their meaning in docs/operating.md#metrics. Two
// kinds:
//  - recorded: counters and histograms fed through the Sink interface (sink.h) by the service
//    and the round coordinator as calls and rounds end. Kept here rather than in
//    prometheus-cpp's Counter/Histogram (a lock per histogram, a compare-and-swap loop per
//    counter): a call is one relaxed atomic increment, a round takes one lock;
//  - read at scrape time: gauges of the sidecar's state (rounds in flight and queued, cache,
//    streams, the rank group) from a Snapshot source, and the process's CPU and memory
//    (process_collector.h).
// Naming follows Prometheus' conventions: the packsched_ prefix, base units, _total counters;
// labels have bounded values (method, code, outcome, phase, cause, kind, backend, store method;
// `stream`, at most --max_streams live, its series removed when the stream is reclaimed).

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "prometheus/collectable.h"
#include "server/metrics/sink.h"

namespace packsched::metrics {

// The sidecar's state at one moment, read at every scrape.
struct Snapshot {
  int64_t rounds_running = 0;  // over every stream (at most one each)
  int64_t rounds_queued = 0;   // outstanding and not running
  int64_t streams = 0;         // live
  int64_t streams_reclaimed = 0;
  int64_t cache_entries = 0;
  int64_t cache_bytes = 0;  // estimated
  int64_t cache_hits = 0;   // callers served from the cache, since start
  int64_t joined = 0;       // callers that joined a round in flight, since start
  int64_t world_size = 1;
  bool group_ready = true;
  int64_t generation = 0;  // the highest of the streams' generations
  std::string backend;     // "local", "gloo", "nccl"
  // Requests this rank made to the rendezvous store so far, by method ("set", "get", "try_get",
  // "compare_and_set", "delete_prefix"; 0 for a group of one, which has no store). Empty: not
  // exported.
  std::vector<std::pair<std::string, int64_t>> store_requests;
};

class SidecarMetrics final : public Sink {
 public:
  struct Options {
    std::string version;  // packsched_build_info{version}
    int64_t proto_version = 0;
    int64_t rank = 0;  // packsched_build_info{rank}
  };
  explicit SidecarMetrics(const Options& options);
  ~SidecarMetrics() override;

  // What the scrape-time gauges read; until set (or when empty) they are not exported. The
  // source is called on the exposer's threads, one scrape at a time or concurrently: it must be
  // thread-safe. SetSnapshotSource(nullptr) before what it reads goes away. Thread-safe.
  void SetSnapshotSource(std::function<Snapshot()> source);

  // What an exposer (exposer.h) serves: the recorded series, the scrape-time gauges and the
  // process collector. Valid while this object lives.
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables() const;

  // The exposition in Prometheus' text format: what GET /metrics answers.
  std::string Serialize() const;

  void Request(Method method, absl::StatusCode code) override;
  void Round(const RoundSample& sample) override;
  void StreamRemoved(absl::string_view stream) override;

 private:
  class StateCollector;
  class RecordedCollector;
  static constexpr int kNumCodes = 17;  // absl::StatusCode 0..16

  // Calls by method and code: lock-free; exported from the start for the codes this server
  // produces (sidecar_metrics.cc: kSeededCodes), for any other code once not zero.
  std::array<std::array<std::atomic<uint64_t>, kNumCodes>, kNumMethods> requests_{};
  // Everything a round records, under one lock: a round takes it once.
  std::shared_ptr<RecordedCollector> recorded_;
  std::shared_ptr<StateCollector> state_;
  std::shared_ptr<prometheus::Collectable> process_;
};

// The value of the `outcome` label of packsched_rounds_total and of the `code` label of
// packsched_requests_total: "OK", "INVALID_ARGUMENT", ... (gRPC's code names).
std::string CodeLabel(absl::StatusCode code);

}  // namespace packsched::metrics

#endif  // PACKSCHED_SERVER_METRICS_SIDECAR_METRICS_H_
