#include "server/metrics/sidecar_metrics.h"

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/metrics/process_collector.h"

namespace packsched::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Upper bounds of each histogram's buckets (+Inf implied).
// Round phases: 100 us to 60 s (the default --collective_timeout), about 2.5x apart.
const std::vector<double> kDurationBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                              0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                              1,      2.5,     5,      10,    30,     60};
const std::vector<double> kImbalanceBuckets = {1.0, 1.001, 1.01, 1.02, 1.05, 1.1, 1.25, 1.5, 2, 4};
const std::vector<double> kMicroBatchBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096};
const std::vector<double> kPaddingBuckets = {0,   0.1, 0.2, 0.3, 0.4,  0.5,
                                             0.6, 0.7, 0.8, 0.9, 0.95, 0.99};
const std::vector<double> kFormationBuckets = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                               0.5,   1,     2.5,  5,     10,   30,  60};

constexpr const char* kMethods[kNumMethods] = {"Plan", "Partition", "BalanceBatch", "GetStatus",
                                               "PlanDynamicCp"};
constexpr const char* kPhases[4] = {"whole", "local", "wait", "partition"};
constexpr const char* kCauses[3] = {"deadline", "aborted", "mismatch"};

// The codes a call or a round of this server can end with: their series exist from start-up at
// 0, so that increase() and rate() see the first occurrence. Any other code gets its series
// when it first occurs.
constexpr absl::StatusCode kSeededCodes[] = {
    absl::StatusCode::kOk,
    absl::StatusCode::kCancelled,
    absl::StatusCode::kInvalidArgument,
    absl::StatusCode::kDeadlineExceeded,
    absl::StatusCode::kFailedPrecondition,
    absl::StatusCode::kAborted,
    absl::StatusCode::kResourceExhausted,
    absl::StatusCode::kUnauthenticated,
    absl::StatusCode::kUnavailable,
    absl::StatusCode::kInternal,
};

bool Seeded(int code) {
  for (absl::StatusCode c : kSeededCodes) {
    if (static_cast<int>(c) == code) return true;
  }
  return false;
}

// A histogram with fixed buckets; its owner guards it.
class Buckets {
 public:
  explicit Buckets(const std::vector<double>& bounds)
      : bounds_(&bounds), counts_(bounds.size() + 1, 0) {}

  void Observe(double value) {
    // The first bucket whose upper bound holds the value (le: value <= bound).
    const size_t i = std::lower_bound(bounds_->begin(), bounds_->end(), value) - bounds_->begin();
    ++counts_[i];
    ++count_;
    sum_ += value;
  }

  ClientMetric ToMetric(std::vector<ClientMetric::Label> labels) const {
    ClientMetric metric;
    metric.label = std::move(labels);
    metric.histogram.sample_count = count_;
    metric.histogram.sample_sum = sum_;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      cumulative += counts_[i];
      metric.histogram.bucket.push_back(
          {cumulative,
           i < bounds_->size() ? (*bounds_)[i] : std::numeric_limits<double>::infinity()});
    }
    return metric;
  }

 private:
  const std::vector<double>* bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

ClientMetric Value(double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.counter.value = value;
  metric.gauge.value = value;
  return metric;
}

MetricFamily Family(std::string name, std::string help, MetricType type,
                    std::vector<ClientMetric> metrics) {
  return MetricFamily{std::move(name), std::move(help), type, std::move(metrics)};
}

MetricFamily Family(std::string name, std::string help, MetricType type, double value) {
  return Family(std::move(name), std::move(help), type, {Value(value)});
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

std::string CodeLabel(absl::StatusCode code) { return absl::StatusCodeToString(code); }

// The gauges read at scrape time from the snapshot source.
class SidecarMetrics::StateCollector final : public prometheus::Collectable {
 public:
  void Set(std::function<Snapshot()> source) {
    absl::MutexLock lock(&mu_);
    source_ = std::move(source);
  }

  std::vector<MetricFamily> Collect() const override {
    Snapshot s;
    {
      absl::MutexLock lock(&mu_);  // held while reading: SetSnapshotSource(nullptr) waits
      if (!source_) return {};
      s = source_();
    }
    std::vector<MetricFamily> out;
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
    MetricFamily backend =
        Family("packsched_group_backend_info", "1, labelled with the collective backend in use",
               MetricType::Gauge, 1);
    backend.metric[0].label.push_back({"backend", s.backend});
    out.push_back(std::move(backend));
    if (!s.store_requests.empty()) {
      std::vector<ClientMetric> by_method;
      for (const auto& [method, count] : s.store_requests) {
        ClientMetric metric = Value(static_cast<double>(count));
        metric.label.push_back({"method", method});
        by_method.push_back(std::move(metric));
      }
      out.push_back(Family("packsched_rendezvous_requests_total",
                           "Requests this rank made to the rendezvous store, by store method",
                           MetricType::Counter, std::move(by_method)));
    }
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::function<Snapshot()> source_ ABSL_GUARDED_BY(mu_);
};

// The token accounting of a stream's successful rounds (RoundSample), one counter each.
struct TokenKind {
  const char* name;
  const char* help;
};
constexpr std::array<TokenKind, 4> kTokenKinds = {{
    {"packsched_stream_logical_tokens_total",
     "The stream's successful rounds: logical tokens (the kept sequences' or rollouts' own "
     "lengths)"},
    {"packsched_stream_executed_tokens_total",
     "The stream's successful rounds: executed tokens (rows forwarded, padding included)"},
    {"packsched_stream_forwarded_tokens_total",
     "The stream's successful rounds: real tokens forwarded (a tree's shared prefix once per "
     "piece); over logical tokens, the tree token ratio"},
    {"packsched_stream_loss_tokens_total",
     "The stream's successful rounds: loss-bearing tokens (0 without loss_tokens)"},
}};

// What rounds record, under one lock, exported as counters, histograms and per-stream gauges.
class SidecarMetrics::RecordedCollector final : public prometheus::Collectable {
 public:
  explicit RecordedCollector(const SidecarMetrics* owner, const Options& options)
      : owner_(owner),
        build_labels_{{"proto_version", absl::StrCat(options.proto_version)},
                      {"rank", absl::StrCat(options.rank)},
                      {"version", options.version}},
        duration_{Buckets(kDurationBuckets), Buckets(kDurationBuckets), Buckets(kDurationBuckets),
                  Buckets(kDurationBuckets)},
        imbalance_(kImbalanceBuckets),
        micro_batches_(kMicroBatchBuckets),
        padding_saved_(kPaddingBuckets),
        formation_(kFormationBuckets) {}

  void Round(const RoundSample& s) {
    const bool ok = s.code == absl::StatusCode::kOk;
    int code = static_cast<int>(s.code);
    if (code < 0 || code >= kNumCodes) code = static_cast<int>(absl::StatusCode::kUnknown);
    absl::MutexLock lock(&mu_);
    ++rounds_[code];
    duration_[0].Observe(Seconds(s.whole));
    if (s.peer_failure != PeerFailure::kNone) {
      ++peer_failures_[static_cast<int>(s.peer_failure) - 1];
    }
    Stream& stream = streams_[s.stream];
    if (s.formations > stream.formations_seen) {
      stream.formations_seen = s.formations;
      formation_.Observe(Seconds(s.last_formation));
    }
    stream.duration = Seconds(s.whole);
    if (!ok) return;
    duration_[1].Observe(Seconds(s.local));
    duration_[2].Observe(Seconds(s.wait));
    duration_[3].Observe(Seconds(s.partition));
    imbalance_.Observe(s.imbalance);
    micro_batches_.Observe(static_cast<double>(s.micro_batches));
    padding_saved_.Observe(s.padding_saved_ratio);
    over_cap_unavoidable_ += s.over_cap_unavoidable;
    over_cap_avoidable_ += s.over_cap_avoidable;
    dropped_ += s.dropped;
    sequences_ += s.sequences;
    stream.has_ok = true;
    stream.last_round = s.round;
    stream.micro_batches = s.micro_batches;
    stream.imbalance = s.imbalance;
    stream.padding_saved = s.padding_saved_ratio;
    stream.tokens[0] += s.logical_tokens;
    stream.tokens[1] += s.executed_tokens;
    stream.tokens[2] += s.forwarded_tokens;
    stream.tokens[3] += s.loss_tokens;
  }

  void StreamRemoved(absl::string_view stream) {
    absl::MutexLock lock(&mu_);
    streams_.erase(stream);
  }

  std::vector<MetricFamily> Collect() const override;

 private:
  struct Stream {
    int64_t formations_seen = 0;
    double duration = 0;  // the last round run
    bool has_ok = false;  // the fields below are set
    int64_t last_round = 0;
    int64_t micro_batches = 0;
    double imbalance = 0;
    double padding_saved = 0;
    std::array<int64_t, 4> tokens = {};  // by kTokenKinds: summed over its successful rounds
  };

  const SidecarMetrics* const owner_;  // its request counters
  const std::vector<ClientMetric::Label> build_labels_;
  mutable absl::Mutex mu_;
  std::array<uint64_t, kNumCodes> rounds_ ABSL_GUARDED_BY(mu_) = {};
  std::array<Buckets, 4> duration_ ABSL_GUARDED_BY(mu_);  // by kPhases
  Buckets imbalance_ ABSL_GUARDED_BY(mu_);
  Buckets micro_batches_ ABSL_GUARDED_BY(mu_);
  Buckets padding_saved_ ABSL_GUARDED_BY(mu_);
  Buckets formation_ ABSL_GUARDED_BY(mu_);
  std::array<uint64_t, 3> peer_failures_ ABSL_GUARDED_BY(mu_) = {};  // by kCauses
  int64_t over_cap_unavoidable_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t over_cap_avoidable_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sequences_ ABSL_GUARDED_BY(mu_) = 0;
  // Live streams (at most --max_streams: removed when reclaimed).
  absl::flat_hash_map<std::string, Stream> streams_ ABSL_GUARDED_BY(mu_);
};

std::vector<MetricFamily> SidecarMetrics::RecordedCollector::Collect() const {
  std::vector<MetricFamily> out;
  std::vector<ClientMetric> requests;
  for (int m = 0; m < kNumMethods; ++m) {
    for (int c = 0; c < kNumCodes; ++c) {
      const uint64_t n = owner_->requests_[m][c].load(std::memory_order_relaxed);
      if (n == 0 && !Seeded(c)) continue;
      requests.push_back(
          Value(static_cast<double>(n),
                {{"code", CodeLabel(static_cast<absl::StatusCode>(c))}, {"method", kMethods[m]}}));
    }
  }
  out.push_back(Family("packsched_requests_total", "Calls answered, by method and status code",
                       MetricType::Counter, std::move(requests)));
  out.push_back(Family("packsched_build_info",
                       "1, labelled with the build's version, the wire protocol version and the "
                       "rank",
                       MetricType::Gauge, {Value(1, build_labels_)}));

  absl::MutexLock lock(&mu_);
  std::vector<ClientMetric> rounds;
  for (int c = 0; c < kNumCodes; ++c) {
    if (rounds_[c] == 0 && !Seeded(c)) continue;
    rounds.push_back(Value(static_cast<double>(rounds_[c]),
                           {{"outcome", CodeLabel(static_cast<absl::StatusCode>(c))}}));
  }
  out.push_back(Family("packsched_rounds_total",
                       "Plan rounds run by this sidecar (not cache hits or joins), by outcome",
                       MetricType::Counter, std::move(rounds)));
  std::vector<ClientMetric> phases;
  phases.reserve(4);
  for (int p = 0; p < 4; ++p) phases.push_back(duration_[p].ToMetric({{"phase", kPhases[p]}}));
  out.push_back(Family("packsched_round_duration_seconds",
                       "Round latency on the stream's worker: whole (every round run), and for "
                       "successful rounds local, wait (agreement) and partition",
                       MetricType::Histogram, std::move(phases)));
  out.push_back(Family("packsched_plan_imbalance",
                       "Largest micro-batch cost over the mean, per successful round",
                       MetricType::Histogram, {imbalance_.ToMetric({})}));
  out.push_back(Family("packsched_plan_micro_batches",
                       "Agreed micro-batch count, per successful round", MetricType::Histogram,
                       {micro_batches_.ToMetric({})}));
  out.push_back(Family("packsched_plan_padding_saved_ratio",
                       "1 - packed rows / rows of a naive padded batch, per successful round",
                       MetricType::Histogram, {padding_saved_.ToMetric({})}));
  out.push_back(
      Family("packsched_plan_over_cap_micro_batches_total",
             "Micro-batches over max_token_len: kind=unavoidable (one sequence longer "
             "than the cap), kind=avoidable (several; must stay 0)",
             MetricType::Counter,
             {Value(static_cast<double>(over_cap_avoidable_), {{"kind", "avoidable"}}),
              Value(static_cast<double>(over_cap_unavoidable_), {{"kind", "unavoidable"}})}));
  out.push_back(Family("packsched_plan_dropped_sequences_total",
                       "Sequences left out of plans (overlong = drop)", MetricType::Counter,
                       static_cast<double>(dropped_)));
  out.push_back(Family("packsched_plan_sequences_total",
                       "Sequences planned by successful rounds (this rank's)", MetricType::Counter,
                       static_cast<double>(sequences_)));
  std::vector<ClientMetric> failures;
  failures.reserve(3);
  for (int c = 0; c < 3; ++c) {
    failures.push_back(Value(static_cast<double>(peer_failures_[c]), {{"cause", kCauses[c]}}));
  }
  out.push_back(Family("packsched_group_peer_failures_total",
                       "Rounds whose agreement failed: cause=deadline (a rank did not arrive), "
                       "aborted (a peer died), mismatch (ranks disagree)",
                       MetricType::Counter, std::move(failures)));
  out.push_back(Family("packsched_group_formation_seconds",
                       "Time to form a stream's collective (a new generation)",
                       MetricType::Histogram, {formation_.ToMetric({})}));
  std::vector<ClientMetric> last_round, micro_batches, imbalance, padding, duration;
  std::array<std::vector<ClientMetric>, 4> tokens;
  for (const auto& [name, stream] : streams_) {
    const std::vector<ClientMetric::Label> labels = {{"stream", name}};
    duration.push_back(Value(stream.duration, labels));
    if (!stream.has_ok) continue;
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i].push_back(Value(static_cast<double>(stream.tokens[i]), labels));
    }
    last_round.push_back(Value(static_cast<double>(stream.last_round), labels));
    micro_batches.push_back(Value(static_cast<double>(stream.micro_batches), labels));
    imbalance.push_back(Value(stream.imbalance, labels));
    padding.push_back(Value(stream.padding_saved, labels));
  }
  out.push_back(Family("packsched_stream_last_round", "The stream's latest round run successfully",
                       MetricType::Gauge, std::move(last_round)));
  out.push_back(Family("packsched_stream_micro_batches",
                       "The stream's last successful round: agreed k", MetricType::Gauge,
                       std::move(micro_batches)));
  out.push_back(Family("packsched_stream_imbalance",
                       "The stream's last successful round: largest micro-batch cost over the "
                       "mean",
                       MetricType::Gauge, std::move(imbalance)));
  out.push_back(Family("packsched_stream_padding_saved_ratio",
                       "The stream's last successful round: padding saved", MetricType::Gauge,
                       std::move(padding)));
  for (size_t i = 0; i < tokens.size(); ++i) {
    out.push_back(Family(kTokenKinds[i].name, kTokenKinds[i].help, MetricType::Counter,
                         std::move(tokens[i])));
  }
  out.push_back(Family("packsched_stream_round_duration_seconds",
                       "The stream's last round run: its whole duration", MetricType::Gauge,
                       std::move(duration)));
  // A family without a series is left out, as prometheus-cpp's serializer would print it.
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const MetricFamily& f) { return f.metric.empty(); }),
            out.end());
  return out;
}

SidecarMetrics::SidecarMetrics(const Options& options)
    : recorded_(std::make_shared<RecordedCollector>(this, options)),
      state_(std::make_shared<StateCollector>()),
      process_(std::make_shared<ProcessCollector>()) {}

SidecarMetrics::~SidecarMetrics() = default;

void SidecarMetrics::SetSnapshotSource(std::function<Snapshot()> source) {
  state_->Set(std::move(source));
}

std::vector<std::weak_ptr<prometheus::Collectable>> SidecarMetrics::collectables() const {
  return {recorded_, state_, process_};
}

std::string SidecarMetrics::Serialize() const {
  std::vector<MetricFamily> families;
  for (const std::weak_ptr<prometheus::Collectable>& weak : collectables()) {
    if (std::shared_ptr<prometheus::Collectable> c = weak.lock()) {
      std::vector<MetricFamily> some = c->Collect();
      families.insert(families.end(), std::make_move_iterator(some.begin()),
                      std::make_move_iterator(some.end()));
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

void SidecarMetrics::Request(Method method, absl::StatusCode code) {
  const int c = static_cast<int>(code);
  if (c < 0 || c >= kNumCodes) return;
  requests_[static_cast<int>(method)][c].fetch_add(1, std::memory_order_relaxed);
}

void SidecarMetrics::Round(const RoundSample& sample) { recorded_->Round(sample); }

void SidecarMetrics::StreamRemoved(absl::string_view stream) { recorded_->StreamRemoved(stream); }

}  // namespace packsched::metrics
