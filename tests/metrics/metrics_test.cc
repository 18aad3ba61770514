// packsched::metrics: what the sink records shows up in the exposition with the values fed in
// (sums computed here from the samples), a reclaimed stream's series go, the scrape-time gauges
// follow their source, the process figures agree with getrusage, and the endpoint serves
// /metrics on loopback.

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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
  s.logical_tokens = 1000;
  s.executed_tokens = 1200;
  s.forwarded_tokens = 600;
  s.loss_tokens = 400;
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
  // Token counters per stream, summed over its successful rounds only.
  EXPECT_EQ(Value(text, "packsched_stream_logical_tokens_total{stream=\"a\"}"), 3 * 1000);
  EXPECT_EQ(Value(text, "packsched_stream_executed_tokens_total{stream=\"a\"}"), 3 * 1200);
  EXPECT_EQ(Value(text, "packsched_stream_forwarded_tokens_total{stream=\"a\"}"), 3 * 600);
  EXPECT_EQ(Value(text, "packsched_stream_loss_tokens_total{stream=\"a\"}"), 3 * 400);
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
  // Every method's series exist from the start, at 0.
  EXPECT_EQ(Value(text, "packsched_requests_total{code=\"OK\",method=\"Partition\"}"), 0);
}

TEST(SidecarMetricsTest, OutcomeAndCodeSeriesExistAtZeroFromTheStart) {
  SidecarMetrics m(TestOptions());
  const std::string text = m.Serialize();
  for (const char* method : {"Plan", "Partition", "BalanceBatch", "GetStatus", "PlanDynamicCp"}) {
    for (const char* code : {"OK", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "ABORTED",
                             "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}) {
      EXPECT_EQ(Value(text, absl::StrCat("packsched_requests_total{code=\"", code, "\",method=\"",
                                         method, "\"}")),
                0)
          << method << " " << code;
    }
  }
  for (const char* outcome : {"OK", "DEADLINE_EXCEEDED", "ABORTED", "FAILED_PRECONDITION"}) {
    EXPECT_EQ(Value(text, absl::StrCat("packsched_rounds_total{outcome=\"", outcome, "\"}")), 0)
        << outcome;
  }
  // A code this server does not produce appears once it occurs.
  EXPECT_THAT(text, Not(HasSubstr("NOT_FOUND")));
  m.Request(Method::kPlan, absl::StatusCode::kNotFound);
  EXPECT_EQ(Value(m.Serialize(), "packsched_requests_total{code=\"NOT_FOUND\",method=\"Plan\"}"),
            1);
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

// A TCP connection to 127.0.0.1:`port` (or [::1]:`port`), reads bounded by `timeout`; -1 when
// it cannot connect.
int Connect(int port, bool v6 = false, absl::Duration timeout = absl::Seconds(10)) {
  const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
  sockaddr_storage storage = {};
  socklen_t length = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&storage);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    a->sin6_addr = in6addr_loopback;
    length = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&storage);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    length = sizeof(*a);
  }
  const timeval tv = {static_cast<time_t>(absl::ToInt64Seconds(timeout)),
                      static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout) % 1000000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` on a new connection and reads the whole response (headers included); what
// came within `timeout` when the server is slower.
std::string HttpRequest(int port, const std::string& request, bool v6 = false,
                        absl::Duration timeout = absl::Seconds(10)) {
  const int fd = Connect(port, v6, timeout);
  std::string response;
  if (fd < 0) return response;
  if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  }
  close(fd);
  return response;
}

// GET `path`: the whole response, headers included.
std::string HttpGet(int port, const std::string& path, bool v6 = false,
                    absl::Duration timeout = absl::Seconds(10)) {
  return HttpRequest(port, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: x\r\n\r\n"), v6, timeout);
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
  for (const char* bad :
       {"127.0.0.1", ":x", "127.0.0.1:70000", "", ":9464", "::1:0", "[127.0.0.1]:0",
        "127.0.0.1:0,0.0.0.0:0", "127.0.0.1:0 ", "[::1]:", "127.0.0.1:+1", "127.0.0.1:0s"}) {
    EXPECT_EQ(MetricsEndpoint::Start(bad, m).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(MetricsEndpointTest, ServesOnIpv6LoopbackAndReportsTheBoundAddress) {
  SidecarMetrics m(TestOptions());
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> v6 = MetricsEndpoint::Start("[::1]:0", m);
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ((*v6)->address(), absl::StrCat("[::1]:", (*v6)->port()));
  EXPECT_THAT(HttpGet((*v6)->port(), "/metrics", /*v6=*/true), HasSubstr("packsched_build_info"));
  // One address: the IPv4 loopback of the same port is not served.
  EXPECT_EQ(Connect((*v6)->port(), /*v6=*/false), -1);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> v4 = MetricsEndpoint::Start("localhost:0", m);
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_THAT((*v4)->address(), ::testing::AnyOf(::testing::StartsWith("127.0.0.1:"),
                                                 ::testing::StartsWith("[::1]:")));
}

TEST(MetricsEndpointTest, AnswersOnlyGetMetrics) {
  SidecarMetrics m(TestOptions());
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", m);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  EXPECT_THAT(HttpGet(port, "/"), HasSubstr("404 Not Found"));
  EXPECT_THAT(HttpGet(port, "/metrics?x=1"), HasSubstr("200 OK"));
  EXPECT_THAT(HttpRequest(port, "POST /metrics HTTP/1.0\r\n\r\n"), HasSubstr("405"));
  const std::string head = HttpRequest(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_THAT(head, HasSubstr("200 OK"));
  EXPECT_THAT(head, Not(HasSubstr("packsched_build_info")));
  EXPECT_THAT(HttpRequest(port, std::string(9000, 'a')), HasSubstr("431"));
}

// Idle and trickling connections hold no worker: with 8 connections that never finish their
// request held open, scrapes are still answered (within 1 s: a functional bound, the endpoint
// answers in microseconds when free), and a connection past its request timeout is closed.
TEST(MetricsEndpointTest, IdleConnectionsDoNotBlockScrapes) {
  SidecarMetrics m(TestOptions());
  MetricsEndpoint::Options options;
  options.request_timeout = absl::Seconds(30);  // the idle ones stay open for the whole test
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", m, options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(Connect(port));
    ASSERT_GE(idle.back(), 0);
    if (i % 2 == 1) {
      ASSERT_EQ(write(idle.back(), "GET /met", 8), 8);  // trickling
    }
  }
  for (int i = 0; i < 6; ++i) {
    EXPECT_THAT(HttpGet(port, "/metrics", false, absl::Seconds(1)),
                HasSubstr("packsched_build_info"))
        << "scrape " << i;
  }
  for (int fd : idle) close(fd);
}

TEST(MetricsEndpointTest, ClosesAConnectionPastItsRequestTimeout) {
  SidecarMetrics m(TestOptions());
  MetricsEndpoint::Options options;
  options.request_timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", m, options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int fd = Connect((*endpoint)->port(), false, absl::Seconds(10));
  ASSERT_GE(fd, 0);
  char buffer[16];
  // The server closes it: read sees end of file (0) well before the 10 s receive timeout.
  EXPECT_EQ(read(fd, buffer, sizeof(buffer)), 0);
  close(fd);
}

TEST(MetricsEndpointTest, KeepsAtMostMaxConnectionsOpen) {
  SidecarMetrics m(TestOptions());
  MetricsEndpoint::Options options;
  options.max_connections = 4;
  options.request_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", m, options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  std::vector<int> idle;
  for (int i = 0; i < 12; ++i) idle.push_back(Connect((*endpoint)->port()));
  EXPECT_THAT(HttpGet((*endpoint)->port(), "/metrics"), HasSubstr("200 OK"));
  // The oldest were closed to make room.
  char buffer[16];
  EXPECT_EQ(read(idle.front(), buffer, sizeof(buffer)), 0);
  for (int fd : idle) close(fd);
}

TEST(MetricsEndpointTest, ServesTheExpositionFromItsCacheWithinTheInterval) {
  SidecarMetrics m(TestOptions());
  MetricsEndpoint::Options cached;
  cached.cache_interval = absl::Hours(1);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", m, cached);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const std::string series = "packsched_requests_total{code=\"OK\",method=\"Plan\"}";
  EXPECT_THAT(HttpGet((*endpoint)->port(), "/metrics"), HasSubstr(series + " 0"));
  m.Request(Method::kPlan, absl::StatusCode::kOk);
  EXPECT_THAT(HttpGet((*endpoint)->port(), "/metrics"), HasSubstr(series + " 0"));
  // With no interval every scrape collects afresh.
  MetricsEndpoint::Options fresh;
  fresh.cache_interval = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> uncached =
      MetricsEndpoint::Start("127.0.0.1:0", m, fresh);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  EXPECT_THAT(HttpGet((*uncached)->port(), "/metrics"), HasSubstr(series + " 1"));
  m.Request(Method::kPlan, absl::StatusCode::kOk);
  EXPECT_THAT(HttpGet((*uncached)->port(), "/metrics"), HasSubstr(series + " 2"));
}

}  // namespace
}  // namespace packsched::metrics
