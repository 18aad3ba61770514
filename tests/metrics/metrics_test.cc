// packsched::metrics: what the sink records shows up in the exposition with the values fed in
// (sums computed here from the samples), a reclaimed stream's series go, the scrape-time gauges
// follow their source, the process figures agree with getrusage, and the endpoint serves
// /metrics on loopback.

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/exposer.h"
#include "server/metrics/process_collector.h"
#include "server/metrics/sidecar_metrics.h"

namespace packsched::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The value of the sample whose series (name and labels, as serialized) is `series`.
std::optional<double> Value(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, series) && absl::ConsumePrefix(&line, " ")) {
      double value;
      const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
      if (absl::SimpleAtod(parts[0], &value)) return value;
    }
  }
  return std::nullopt;
}

SidecarMetrics::Options TestOptions() { return {"9.9.9", 1, 3}; }

RoundSample Ok(absl::string_view stream, int64_t round, absl::Duration whole) {
  RoundSample s;
  s.stream = stream;
  s.round = round;
  s.whole = whole;
  s.local = whole / 4;
  s.wait = whole / 2;
  s.partition = whole / 4;
  s.micro_batches = 4;
  s.sequences = 100;
  s.imbalance = 1.01;
  s.padding_saved_ratio = 0.5;
  return s;
}

TEST(SidecarMetricsTest, RoundsCountedByOutcomeWithPhaseHistograms) {
  SidecarMetrics m(TestOptions());
  const std::vector<absl::Duration> ok = {absl::Milliseconds(2), absl::Milliseconds(3),
                                          absl::Milliseconds(7)};
  double whole_sum = 0, partition_sum = 0;
  for (size_t i = 0; i < ok.size(); ++i) {
    RoundSample s = Ok("a", static_cast<int64_t>(i), ok[i]);
    s.over_cap_unavoidable = 1;
    s.dropped = 2;
    m.Round(s);
    whole_sum += absl::ToDoubleSeconds(ok[i]);
    partition_sum += absl::ToDoubleSeconds(ok[i] / 4);
  }
  RoundSample failed;
  failed.stream = "a";
  failed.round = 9;
  failed.code = absl::StatusCode::kDeadlineExceeded;
  failed.peer_failure = PeerFailureOf(failed.code);
  failed.whole = absl::Seconds(1);
  m.Round(failed);
  whole_sum += 1;

  const std::string text = m.Serialize();
  EXPECT_EQ(Value(text, "packsched_rounds_total{outcome=\"OK\"}"), 3);
  EXPECT_EQ(Value(text, "packsched_rounds_total{outcome=\"DEADLINE_EXCEEDED\"}"), 1);
  EXPECT_EQ(Value(text, "packsched_round_duration_seconds_count{phase=\"whole\"}"), 4);
  EXPECT_EQ(Value(text, "packsched_round_duration_seconds_count{phase=\"partition\"}"), 3);
  EXPECT_NEAR(*Value(text, "packsched_round_duration_seconds_sum{phase=\"whole\"}"), whole_sum,
              1e-9);
  EXPECT_NEAR(*Value(text, "packsched_round_duration_seconds_sum{phase=\"partition\"}"),
              partition_sum, 1e-9);
  // Cumulative buckets: le="0.0025" holds the 2 ms round, le="0.005" the 2 and 3 ms ones.
  EXPECT_EQ(Value(text, "packsched_round_duration_seconds_bucket{phase=\"whole\",le=\"0.0025\"}"),
            1);
  EXPECT_EQ(Value(text, "packsched_round_duration_seconds_bucket{phase=\"whole\",le=\"0.005\"}"),
            2);
  EXPECT_EQ(Value(text, "packsched_group_peer_failures_total{cause=\"deadline\"}"), 1);
  EXPECT_EQ(Value(text, "packsched_group_peer_failures_total{cause=\"aborted\"}"), 0);
  EXPECT_EQ(Value(text, "packsched_plan_over_cap_micro_batches_total{kind=\"unavoidable\"}"), 3);
  EXPECT_EQ(Value(text, "packsched_plan_over_cap_micro_batches_total{kind=\"avoidable\"}"), 0);
  EXPECT_EQ(Value(text, "packsched_plan_dropped_sequences_total"), 6);
  EXPECT_EQ(Value(text, "packsched_plan_sequences_total"), 300);
  EXPECT_EQ(Value(text, "packsched_plan_micro_batches_count"), 3);
  EXPECT_EQ(Value(text, "packsched_stream_last_round{stream=\"a\"}"), 2);  // the failed 9 is not
  EXPECT_EQ(Value(text, "packsched_stream_round_duration_seconds{stream=\"a\"}"), 1);
  EXPECT_EQ(Value(text, "packsched_build_info{proto_version=\"1\",rank=\"3\",version=\"9.9.9\"}"),
            1);
}

TEST(SidecarMetricsTest, RequestsByMethodAndCode) {
  SidecarMetrics m(TestOptions());
  for (int i = 0; i < 5; ++i) m.Request(Method::kPlan, absl::StatusCode::kOk);
  m.Request(Method::kPlan, absl::StatusCode::kInvalidArgument);
  m.Request(Method::kGetStatus, absl::StatusCode::kOk);
  const std::string text = m.Serialize();
  EXPECT_EQ(Value(text, "packsched_requests_total{code=\"OK\",method=\"Plan\"}"), 5);
  EXPECT_EQ(Value(text, "packsched_requests_total{code=\"INVALID_ARGUMENT\",method=\"Plan\"}"), 1);
  EXPECT_EQ(Value(text, "packsched_requests_total{code=\"OK\",method=\"GetStatus\"}"), 1);
  EXPECT_EQ(Value(text, "packsched_requests_total{code=\"OK\",method=\"Partition\"}"),
            std::nullopt);
}

TEST(SidecarMetricsTest, ReclaimedStreamSeriesAreRemoved) {
  SidecarMetrics m(TestOptions());
  m.Round(Ok("a", 1, absl::Milliseconds(1)));
  m.Round(Ok("b", 1, absl::Milliseconds(1)));
  m.StreamRemoved("a");
  const std::string text = m.Serialize();
  EXPECT_THAT(text, Not(HasSubstr("stream=\"a\"")));
  EXPECT_EQ(Value(text, "packsched_stream_micro_batches{stream=\"b\"}"), 4);
  // Made again, it starts afresh.
  m.Round(Ok("a", 7, absl::Milliseconds(1)));
  EXPECT_EQ(Value(m.Serialize(), "packsched_stream_last_round{stream=\"a\"}"), 7);
}

TEST(SidecarMetricsTest, EachNewFormationObservedOnce) {
  SidecarMetrics m(TestOptions());
  RoundSample s = Ok("a", 1, absl::Milliseconds(1));
  s.formations = 1;
  s.last_formation = absl::Milliseconds(30);
  m.Round(s);
  s.round = 2;
  m.Round(s);  // the same formation
  s.round = 3;
  s.formations = 2;
  s.last_formation = absl::Milliseconds(70);
  m.Round(s);
  const std::string text = m.Serialize();
  EXPECT_EQ(Value(text, "packsched_group_formation_seconds_count"), 2);
  EXPECT_NEAR(*Value(text, "packsched_group_formation_seconds_sum"), 0.1, 1e-9);
}

TEST(SidecarMetricsTest, ScrapeTimeGaugesFollowTheSource) {
  SidecarMetrics m(TestOptions());
  EXPECT_THAT(m.Serialize(), Not(HasSubstr("packsched_rounds_queued")));
  Snapshot s;
  s.rounds_running = 2;
  s.rounds_queued = 5;
  s.cache_entries = 11;
  s.cache_bytes = 4096;
  s.world_size = 4;
  s.group_ready = false;
  s.generation = 3;
  s.backend = "gloo";
  m.SetSnapshotSource([&s] { return s; });
  std::string text = m.Serialize();
  EXPECT_EQ(Value(text, "packsched_rounds_in_flight"), 2);
  EXPECT_EQ(Value(text, "packsched_rounds_queued"), 5);
  EXPECT_EQ(Value(text, "packsched_cache_entries"), 11);
  EXPECT_EQ(Value(text, "packsched_cache_bytes"), 4096);
  EXPECT_EQ(Value(text, "packsched_group_world_size"), 4);
  EXPECT_EQ(Value(text, "packsched_group_ready"), 0);
  EXPECT_EQ(Value(text, "packsched_group_generation"), 3);
  EXPECT_EQ(Value(text, "packsched_group_backend_info{backend=\"gloo\"}"), 1);
  s.generation = 4;
  EXPECT_EQ(Value(m.Serialize(), "packsched_group_generation"), 4);
  m.SetSnapshotSource(nullptr);
  EXPECT_THAT(m.Serialize(), Not(HasSubstr("packsched_group_generation")));
}

TEST(ProcessCollectorTest, AgreesWithGetrusage) {
  // Burn some CPU so that both clocks are well above their 10 ms granularity.
  volatile double x = 0;
  for (int i = 0; i < 30000000; ++i) x = x + std::sqrt(static_cast<double>(i));
  rusage usage{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &usage), 0);
  const std::optional<ProcessStat> stat = ReadProcessStat();
  ASSERT_TRUE(stat.has_value());
  const double rusage_cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 +
                            usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6;
  EXPECT_NEAR(stat->cpu_seconds, rusage_cpu, 0.05);
  // ru_maxrss (KiB) is the peak resident size: never below the current one.
  EXPECT_GT(stat->resident_bytes, 0);
  EXPECT_LE(stat->resident_bytes, usage.ru_maxrss * 1024.0 + 4096);
  EXPECT_GE(stat->virtual_bytes, stat->resident_bytes);
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_LE(stat->start_time_seconds, now + 1);
  EXPECT_GT(stat->start_time_seconds, now - 3600);
  SidecarMetrics m(TestOptions());
  const std::string text = m.Serialize();
  EXPECT_THAT(text, HasSubstr("process_cpu_seconds_total "));
  EXPECT_THAT(text, HasSubstr("process_resident_memory_bytes "));
  EXPECT_THAT(text, HasSubstr("process_open_fds "));
}

// GET `path` from 127.0.0.1:`port`: the whole response, headers included.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  return response;
}

TEST(MetricsEndpointTest, ServesMetricsOnAPickedPort) {
  SidecarMetrics m(TestOptions());
  m.Request(Method::kPlan, absl::StatusCode::kOk);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", m);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);
  const std::string response = HttpGet((*endpoint)->port(), "/metrics");
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("packsched_requests_total{code=\"OK\",method=\"Plan\"} 1"));
  EXPECT_THAT(response, HasSubstr("process_cpu_seconds_total"));

  // The port is taken now.
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> second =
      MetricsEndpoint::Start(absl::StrCat("127.0.0.1:", (*endpoint)->port()), m);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

TEST(MetricsEndpointTest, RefusesAnAddressWithoutAPort) {
  SidecarMetrics m(TestOptions());
  for (const char* bad : {"127.0.0.1", ":x", "127.0.0.1:70000", ""}) {
    EXPECT_EQ(MetricsEndpoint::Start(bad, m).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace packsched::metrics
