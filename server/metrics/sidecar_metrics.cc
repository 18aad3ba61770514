#include "server/metrics/sidecar_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/metrics/process_collector.h"

namespace packsched::metrics {
namespace {

using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;

// Round phases: 100 us to 60 s (the default --collective_timeout), about 2.5x apart.
const Histogram::BucketBoundaries& DurationBuckets() {
  static const auto* const buckets = new Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *buckets;
}

Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                        const std::string& help, const Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add({}, buckets);
}

Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                    const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Family<Gauge>& GaugeFamily(prometheus::Registry& registry, const std::string& name,
                                       const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily family{std::move(name), std::move(help), type, {}};
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
  return family;
}

}  // namespace

std::string CodeLabel(absl::StatusCode code) { return absl::StatusCodeToString(code); }

// The gauges read at scrape time from the snapshot source.
class SidecarMetrics::StateCollector final : public prometheus::Collectable {
 public:
  void Set(std::function<Snapshot()> source) {
    absl::MutexLock lock(&mu_);
    source_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    Snapshot s;
    {
      absl::MutexLock lock(&mu_);  // held while reading: SetSnapshotSource(nullptr) waits
      if (!source_) return {};
      s = source_();
    }
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> out;
    out.push_back(Family("packsched_rounds_in_flight", "Rounds running now (at most one a stream)",
                         MetricType::Gauge, s.rounds_running));
    out.push_back(Family("packsched_rounds_queued",
                         "Rounds received and waiting for their stream's worker", MetricType::Gauge,
                         s.rounds_queued));
    out.push_back(Family("packsched_streams", "Live planning streams (at most --max_streams)",
                         MetricType::Gauge, s.streams));
    out.push_back(Family("packsched_streams_reclaimed_total",
                         "Idle streams reclaimed after --stream_idle_timeout", MetricType::Counter,
                         s.streams_reclaimed));
    out.push_back(Family("packsched_cache_entries", "Finished rounds kept for late callers",
                         MetricType::Gauge, s.cache_entries));
    out.push_back(Family("packsched_cache_bytes",
                         "Estimated bytes of the finished rounds kept (--max_cached_bytes)",
                         MetricType::Gauge, s.cache_bytes));
    out.push_back(Family("packsched_cache_hits_total", "Callers served from the result cache",
                         MetricType::Counter, s.cache_hits));
    out.push_back(Family("packsched_rounds_joined_total",
                         "Callers that joined a round already queued or running",
                         MetricType::Counter, s.joined));
    out.push_back(Family("packsched_group_world_size", "Ranks in the group (1: a group of one)",
                         MetricType::Gauge, s.world_size));
    out.push_back(Family("packsched_group_ready",
                         "1 when every rank has joined and no stream is between generations",
                         MetricType::Gauge, s.group_ready ? 1 : 0));
    out.push_back(Family("packsched_group_generation",
                         "The highest generation of the streams' collectives (0 before any)",
                         MetricType::Gauge, s.generation));
    prometheus::MetricFamily backend =
        Family("packsched_group_backend_info", "1, labelled with the collective backend in use",
               MetricType::Gauge, 1);
    backend.metric[0].label.push_back({"backend", s.backend});
    out.push_back(std::move(backend));
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::function<Snapshot()> source_ ABSL_GUARDED_BY(mu_);
};

struct SidecarMetrics::StreamSeries {
  Gauge* last_round;
  Gauge* micro_batches;
  Gauge* imbalance;
  Gauge* padding_saved;
  Gauge* duration;
  int64_t formations_seen = 0;
};

SidecarMetrics::SidecarMetrics(const Options& options)
    : registry_(std::make_shared<prometheus::Registry>()),
      state_(std::make_shared<StateCollector>()),
      process_(std::make_shared<ProcessCollector>()),
      requests_(prometheus::BuildCounter()
                    .Name("packsched_requests_total")
                    .Help("Calls answered, by method and status code")
                    .Register(*registry_)),
      rounds_(prometheus::BuildCounter()
                  .Name("packsched_rounds_total")
                  .Help("Plan rounds run by this sidecar (not cache hits or joins), by outcome")
                  .Register(*registry_)),
      round_duration_(prometheus::BuildHistogram()
                          .Name("packsched_round_duration_seconds")
                          .Help("Round latency on the stream's worker: whole (every round run), "
                                "and for successful rounds local, wait (agreement) and partition")
                          .Register(*registry_)),
      duration_whole_(round_duration_.Add({{"phase", "whole"}}, DurationBuckets())),
      duration_local_(round_duration_.Add({{"phase", "local"}}, DurationBuckets())),
      duration_wait_(round_duration_.Add({{"phase", "wait"}}, DurationBuckets())),
      duration_partition_(round_duration_.Add({{"phase", "partition"}}, DurationBuckets())),
      imbalance_(AddHistogram(*registry_, "packsched_plan_imbalance",
                              "Largest micro-batch cost over the mean, per successful round",
                              {1.0, 1.001, 1.01, 1.02, 1.05, 1.1, 1.25, 1.5, 2, 4})),
      micro_batches_(AddHistogram(*registry_, "packsched_plan_micro_batches",
                                  "Agreed micro-batch count, per successful round",
                                  {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096})),
      padding_saved_(
          AddHistogram(*registry_, "packsched_plan_padding_saved_ratio",
                       "1 - packed rows / rows of a naive padded batch, per successful round",
                       {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99})),
      over_cap_(prometheus::BuildCounter()
                    .Name("packsched_plan_over_cap_micro_batches_total")
                    .Help("Micro-batches over max_token_len: kind=unavoidable (one sequence "
                          "longer than the cap), kind=avoidable (several; must stay 0)")
                    .Register(*registry_)),
      over_cap_unavoidable_(over_cap_.Add({{"kind", "unavoidable"}})),
      over_cap_avoidable_(over_cap_.Add({{"kind", "avoidable"}})),
      dropped_(AddCounter(*registry_, "packsched_plan_dropped_sequences_total",
                          "Sequences left out of plans (overlong = drop)")),
      sequences_(AddCounter(*registry_, "packsched_plan_sequences_total",
                            "Sequences planned by successful rounds (this rank's)")),
      peer_failures_(prometheus::BuildCounter()
                         .Name("packsched_group_peer_failures_total")
                         .Help("Rounds whose agreement failed: cause=deadline (a rank did not "
                               "arrive), aborted (a peer died), mismatch (ranks disagree)")
                         .Register(*registry_)),
      peer_failure_by_cause_{&peer_failures_.Add({{"cause", "deadline"}}),
                             &peer_failures_.Add({{"cause", "aborted"}}),
                             &peer_failures_.Add({{"cause", "mismatch"}})},
      formation_(
          AddHistogram(*registry_, "packsched_group_formation_seconds",
                       "Time to form a stream's collective (a new generation)",
                       {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})),
      stream_last_round_(GaugeFamily(*registry_, "packsched_stream_last_round",
                                     "The stream's latest round run successfully")),
      stream_micro_batches_(GaugeFamily(*registry_, "packsched_stream_micro_batches",
                                        "The stream's last successful round: agreed k")),
      stream_imbalance_(GaugeFamily(*registry_, "packsched_stream_imbalance",
                                    "The stream's last successful round: largest micro-batch "
                                    "cost over the mean")),
      stream_padding_saved_(GaugeFamily(*registry_, "packsched_stream_padding_saved_ratio",
                                        "The stream's last successful round: padding saved")),
      stream_duration_(GaugeFamily(*registry_, "packsched_stream_round_duration_seconds",
                                   "The stream's last round run: its whole duration")) {
  prometheus::BuildGauge()
      .Name("packsched_build_info")
      .Help("1, labelled with the build's version, the wire protocol version and the rank")
      .Register(*registry_)
      .Add({{"version", options.version},
            {"proto_version", absl::StrCat(options.proto_version)},
            {"rank", absl::StrCat(options.rank)}})
      .Set(1);
  for (auto& by_code : requests_by_) {
    for (auto& counter : by_code) counter.store(nullptr, std::memory_order_relaxed);
  }
  for (auto& counter : rounds_by_) counter.store(nullptr, std::memory_order_relaxed);
}

SidecarMetrics::~SidecarMetrics() = default;

void SidecarMetrics::SetSnapshotSource(std::function<Snapshot()> source) {
  state_->Set(std::move(source));
}

std::vector<std::weak_ptr<prometheus::Collectable>> SidecarMetrics::collectables() const {
  return {registry_, state_, process_};
}

std::string SidecarMetrics::Serialize() const {
  std::vector<prometheus::MetricFamily> families;
  for (const std::weak_ptr<prometheus::Collectable>& weak : collectables()) {
    if (std::shared_ptr<prometheus::Collectable> c = weak.lock()) {
      std::vector<prometheus::MetricFamily> some = c->Collect();
      families.insert(families.end(), std::make_move_iterator(some.begin()),
                      std::make_move_iterator(some.end()));
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

void SidecarMetrics::Request(Method method, absl::StatusCode code) {
  const int c = static_cast<int>(code);
  if (c < 0 || c >= kNumCodes) return;
  std::atomic<Counter*>& slot = requests_by_[static_cast<int>(method)][c];
  Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    static constexpr const char* kMethods[kNumMethods] = {"Plan", "Partition", "BalanceBatch",
                                                          "GetStatus"};
    absl::MutexLock lock(&create_mu_);
    counter = slot.load(std::memory_order_acquire);
    if (counter == nullptr) {
      counter = &requests_.Add(
          {{"method", kMethods[static_cast<int>(method)]}, {"code", CodeLabel(code)}});
      slot.store(counter, std::memory_order_release);
    }
  }
  counter->Increment();
}

Counter& SidecarMetrics::RoundsCounter(absl::StatusCode code) {
  int c = static_cast<int>(code);
  if (c < 0 || c >= kNumCodes) c = static_cast<int>(absl::StatusCode::kUnknown);
  std::atomic<Counter*>& slot = rounds_by_[c];
  Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    absl::MutexLock lock(&create_mu_);
    counter = slot.load(std::memory_order_acquire);
    if (counter == nullptr) {
      counter = &rounds_.Add({{"outcome", CodeLabel(static_cast<absl::StatusCode>(c))}});
      slot.store(counter, std::memory_order_release);
    }
  }
  return *counter;
}

void SidecarMetrics::Round(const RoundSample& s) {
  RoundsCounter(s.code).Increment();
  duration_whole_.Observe(Seconds(s.whole));
  if (s.peer_failure != PeerFailure::kNone) {
    peer_failure_by_cause_[static_cast<int>(s.peer_failure) - 1]->Increment();
  }
  const bool ok = s.code == absl::StatusCode::kOk;
  if (ok) {
    duration_local_.Observe(Seconds(s.local));
    duration_wait_.Observe(Seconds(s.wait));
    duration_partition_.Observe(Seconds(s.partition));
    imbalance_.Observe(s.imbalance);
    micro_batches_.Observe(static_cast<double>(s.micro_batches));
    padding_saved_.Observe(s.padding_saved_ratio);
    if (s.over_cap_unavoidable > 0) {
      over_cap_unavoidable_.Increment(static_cast<double>(s.over_cap_unavoidable));
    }
    if (s.over_cap_avoidable > 0) {
      over_cap_avoidable_.Increment(static_cast<double>(s.over_cap_avoidable));
    }
    if (s.dropped > 0) dropped_.Increment(static_cast<double>(s.dropped));
    sequences_.Increment(static_cast<double>(s.sequences));
  }

  absl::MutexLock lock(&streams_mu_);
  std::unique_ptr<StreamSeries>& series = streams_[s.stream];
  if (series == nullptr) {
    const prometheus::Labels labels = {{"stream", std::string(s.stream)}};
    series = std::make_unique<StreamSeries>(
        StreamSeries{&stream_last_round_.Add(labels), &stream_micro_batches_.Add(labels),
                     &stream_imbalance_.Add(labels), &stream_padding_saved_.Add(labels),
                     &stream_duration_.Add(labels)});
  }
  if (s.formations > series->formations_seen) {
    series->formations_seen = s.formations;
    formation_.Observe(Seconds(s.last_formation));
  }
  series->duration->Set(Seconds(s.whole));
  if (ok) {
    series->last_round->Set(static_cast<double>(s.round));
    series->micro_batches->Set(static_cast<double>(s.micro_batches));
    series->imbalance->Set(s.imbalance);
    series->padding_saved->Set(s.padding_saved_ratio);
  }
}

void SidecarMetrics::StreamRemoved(absl::string_view stream) {
  absl::MutexLock lock(&streams_mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  const StreamSeries& series = *it->second;
  stream_last_round_.Remove(series.last_round);
  stream_micro_batches_.Remove(series.micro_batches);
  stream_imbalance_.Remove(series.imbalance);
  stream_padding_saved_.Remove(series.padding_saved);
  stream_duration_.Remove(series.duration);
  streams_.erase(it);
}

}  // namespace packsched::metrics
