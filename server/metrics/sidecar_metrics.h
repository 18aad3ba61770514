#ifndef PACKSCHED_SERVER_METRICS_SIDECAR_METRICS_H_
#define PACKSCHED_SERVER_METRICS_SIDECAR_METRICS_H_

// The sidecar's Prometheus metrics (prometheus-cpp): every series the sidecar exports, named
// once here and listed with their meaning in docs/operating.md#metrics. Two kinds:
//  - recorded: counters and histograms fed through the Sink interface (sink.h) by the service
//    and the round coordinator as calls and rounds end;
//  - read at scrape time: gauges of the sidecar's state (rounds in flight and queued, cache,
//    streams, the rank group) from a Snapshot source, and the process's CPU and memory
//    (process_collector.h).
// Naming follows Prometheus' conventions: the packsched_ prefix, base units, _total counters;
// labels have bounded values (method, code, outcome, phase, cause, kind, backend; `stream`, at
// most --max_streams live, its series removed when the stream is reclaimed).

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
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
  struct StreamSeries;
  static constexpr int kNumCodes = 17;  // absl::StatusCode 0..16

  prometheus::Counter& RoundsCounter(absl::StatusCode code);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<StateCollector> state_;
  std::shared_ptr<prometheus::Collectable> process_;

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& rounds_;
  prometheus::Family<prometheus::Histogram>& round_duration_;
  prometheus::Histogram& duration_whole_;
  prometheus::Histogram& duration_local_;
  prometheus::Histogram& duration_wait_;
  prometheus::Histogram& duration_partition_;
  prometheus::Histogram& imbalance_;
  prometheus::Histogram& micro_batches_;
  prometheus::Histogram& padding_saved_;
  prometheus::Family<prometheus::Counter>& over_cap_;
  prometheus::Counter& over_cap_unavoidable_;
  prometheus::Counter& over_cap_avoidable_;
  prometheus::Counter& dropped_;
  prometheus::Counter& sequences_;
  prometheus::Family<prometheus::Counter>& peer_failures_;
  std::array<prometheus::Counter*, 3> peer_failure_by_cause_;
  prometheus::Histogram& formation_;
  prometheus::Family<prometheus::Gauge>& stream_last_round_;
  prometheus::Family<prometheus::Gauge>& stream_micro_batches_;
  prometheus::Family<prometheus::Gauge>& stream_imbalance_;
  prometheus::Family<prometheus::Gauge>& stream_padding_saved_;
  prometheus::Family<prometheus::Gauge>& stream_duration_;

  // Created at first use (labels with many possible values, few seen).
  std::array<std::array<std::atomic<prometheus::Counter*>, kNumCodes>, kNumMethods> requests_by_;
  std::array<std::atomic<prometheus::Counter*>, kNumCodes> rounds_by_;
  absl::Mutex create_mu_;  // creating those

  absl::Mutex streams_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<StreamSeries>> streams_
      ABSL_GUARDED_BY(streams_mu_);
};

// The value of the `outcome` label of packsched_rounds_total and of the `code` label of
// packsched_requests_total: "OK", "INVALID_ARGUMENT", ... (gRPC's code names).
std::string CodeLabel(absl::StatusCode code);

}  // namespace packsched::metrics

#endif  // PACKSCHED_SERVER_METRICS_SIDECAR_METRICS_H_
