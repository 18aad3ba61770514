// packsched::sidecar, the pieces of packsched-server's main: the flags turned into options, the
// rank group's checks and wiring (without a network: what fails before any connection), the
// probe's own refusal, and the port file. The real binary: tests/e2e.

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/counting_store.h"
#include "server/collective/store.h"
#include "server/sidecar/flags.h"
#include "server/sidecar/metrics.h"
#include "server/sidecar/probe.h"
#include "server/sidecar/process.h"
#include "server/sidecar/rank_group.h"
#include "server/sidecar/status.h"
#include "tests/testing/temp_dir.h"

ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(std::string, rendezvous);
ABSL_DECLARE_FLAG(int64_t, world_size);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(absl::Duration, stream_idle_timeout);

namespace packsched::sidecar {
namespace {

using ::testing::HasSubstr;

using ::packsched::testing::TempDir;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(Flags, DefaultsMakeValidOptions) {
  const absl::StatusOr<service::ServerOptions> options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->listen, "127.0.0.1:50051");
  EXPECT_TRUE(options->auth_token.empty());
  EXPECT_FALSE(options->build_version.empty());
  const RankGroupFlags group = RankGroupFlagsFromFlags();
  EXPECT_EQ(group.world_size, 1);
  EXPECT_EQ(group.backend, "auto");
  EXPECT_TRUE(ProbeFlagsFromFlags().target.empty());
}

TEST(Flags, TheTokenFileIsRead) {
  TempDir dir;
  absl::SetFlag(&FLAGS_auth_token_file, dir.File("missing"));
  EXPECT_THAT(Message(ServerOptionsFromFlags().status()), HasSubstr("--auth_token_file = '"));
  absl::SetFlag(&FLAGS_auth_token_file, dir.path());  // a directory: refused, not an abort
  EXPECT_THAT(Message(ServerOptionsFromFlags().status()), HasSubstr("cannot be read"));
  std::ofstream(dir.File("token")) << "  s3cret\n";
  absl::SetFlag(&FLAGS_auth_token_file, dir.File("token"));
  const absl::StatusOr<service::ServerOptions> options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->auth_token, "s3cret");
  absl::SetFlag(&FLAGS_auth_token_file, "");
}

TEST(Flags, StreamIdleTimeoutZeroIsNever) {
  absl::StatusOr<service::ServerOptions> options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->limits.stream_idle_timeout, absl::Minutes(30));
  absl::SetFlag(&FLAGS_stream_idle_timeout, absl::ZeroDuration());  // never
  options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->limits.stream_idle_timeout, absl::ZeroDuration());
  absl::SetFlag(&FLAGS_stream_idle_timeout, absl::Minutes(30));
}

// The backend GetStatus and the metrics report before a stream has formed its collective: the
// configured one (it was "local" for a Gloo group until its first Plan).
TEST(Flags, TheConfiguredBackendIsReportedFromTheStart) {
  EXPECT_EQ(ServerOptionsFromFlags()->backend, "local");  // a group of one
  absl::SetFlag(&FLAGS_world_size, 4);
  absl::SetFlag(&FLAGS_backend, "gloo");
  EXPECT_EQ(ServerOptionsFromFlags()->backend, "gloo");
  absl::SetFlag(&FLAGS_backend, "auto");
  EXPECT_EQ(ServerOptionsFromFlags()->backend, "auto");
  absl::SetFlag(&FLAGS_world_size, 1);
  EXPECT_EQ(ServerOptionsFromFlags()->backend, "local");
}

TEST(Flags, GroupFlagsAreReadAsGiven) {
  absl::SetFlag(&FLAGS_rendezvous, "host0:29400");
  absl::SetFlag(&FLAGS_world_size, 4);
  const RankGroupFlags group = RankGroupFlagsFromFlags();
  EXPECT_EQ(group.rendezvous, "host0:29400");
  EXPECT_EQ(group.world_size, 4);
  absl::SetFlag(&FLAGS_rendezvous, "");
  absl::SetFlag(&FLAGS_world_size, 1);
}

absl::Status StartError(const RankGroupFlags& flags,
                        const service::ServerOptions& server = service::ServerOptions()) {
  return StartRankGroup(flags, server).status();
}

TEST(RankGroup, AGroupOfOneHasNothingToStart) {
  absl::StatusOr<RankGroup> group = StartRankGroup(RankGroupFlags(), service::ServerOptions());
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(group->group, nullptr);
  EXPECT_EQ(group->store, nullptr);
  EXPECT_EQ(group->server, nullptr);
  EXPECT_EQ(group->readiness, nullptr);
  service::ServerOptions options;
  AttachRankGroup(*group, options);
  // The server is handed the agreements of a group of one: one rank, serving at once.
  ASSERT_NE(options.agreements, nullptr);
  EXPECT_EQ(options.agreements, group->agreements);
  EXPECT_EQ(options.agreements->world_size(), 1);
  EXPECT_TRUE(options.agreements->serving());
  EXPECT_FALSE(options.cancel_group_waits);
  StopRankGroup(*group);
}

TEST(RankGroup, FlagsAreCheckedBeforeAnyConnection) {
  RankGroupFlags f;
  f.world_size = 0;
  EXPECT_EQ(Message(StartError(f)), "--world_size = 0: must be >= 1");
  f.world_size = 2;
  f.rank = 2;
  EXPECT_EQ(Message(StartError(f)), "--rank = 2: must be in [0, --world_size = 2)");
  f.rank = 1;
  EXPECT_EQ(Message(StartError(f)), "--world_size = 2 needs --rendezvous=HOST:PORT");
  f.world_size = 1;
  f.rank = 0;
  f.backend = "gloo";
  EXPECT_EQ(Message(StartError(f)), "--backend = gloo needs --rendezvous=HOST:PORT");
  f.backend = "carrier-pigeon";
  EXPECT_EQ(StartError(f).code(), absl::StatusCode::kInvalidArgument);

  RankGroupFlags tls;
  tls.rank = 1;
  tls.world_size = 2;
  tls.rendezvous = "10.9.9.9:29400";
  tls.rendezvous_tls = true;
  EXPECT_EQ(Message(StartError(tls)), "--rendezvous_tls needs --tls_cert and --tls_key");
  tls.rendezvous_tls = false;
  tls.rendezvous_tls_ca = "/ca.pem";
  EXPECT_EQ(Message(StartError(tls)), "--rendezvous_tls_ca needs --rendezvous_tls");
}

TEST(RankGroup, TheTokenIsNotSentToTheRendezvousInPlaintextOffLoopback) {
  RankGroupFlags f;
  f.rank = 1;  // no store served here: the client is the first thing made
  f.world_size = 2;
  f.rendezvous = "10.9.9.9:29400";
  service::ServerOptions server;
  server.auth_token = "t";
  const absl::Status status = StartError(f, server);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(status), HasSubstr("--rendezvous = 10.9.9.9:29400"));
}

// A rendezvous host that does not resolve stops the start with an error naming DNS, with
// --gloo_iface too (Gloo's address then does not come from the rendezvous connection).
TEST(RankGroup, AnUnresolvableRendezvousHostIsADnsErrorAtStart) {
  for (const std::string iface : {"", "lo"}) {
    RankGroupFlags f;
    f.rank = 1;
    f.world_size = 2;
    f.rendezvous = "no-such-host.invalid:29400";
    f.backend = "gloo";
    f.gloo_iface = iface;
    const absl::Status status = StartError(f);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << iface << ": " << status;
    EXPECT_THAT(Message(status), HasSubstr("--rendezvous = 'no-such-host.invalid:29400'"));
    EXPECT_THAT(Message(status), HasSubstr("DNS"));
  }
}

TEST(Probe, TlsNeedsACertificateAuthority) {
  ProbeFlags f;
  f.target = "127.0.0.1:1";
  f.tls_cert = "/server.pem";
  f.tls_key = "/server.key";
  EXPECT_EQ(RunProbe(f), 1);
}

TEST(Probe, NothingListeningIsNotServing) {
  ProbeFlags f;
  f.target = "127.0.0.1:1";
  EXPECT_EQ(RunProbe(f), 1);
}

TEST(Process, WritesThePortFile) {
  TempDir dir;
  ASSERT_TRUE(WritePortFile(dir.File("port"), 50123).ok());
  EXPECT_EQ(ReadAll(dir.File("port")), "50123\n");
  EXPECT_EQ(WritePortFile(dir.File("no/such/dir/port"), 1).code(), absl::StatusCode::kInternal);
}

// --status's table: the group line and one row per stream with its last round and latency.
TEST(StatusTable, ShowsTheGroupAndEveryStream) {
  v1::GetStatusResponse status;
  status.set_rank(1);
  status.set_world_size(4);
  status.set_backend("gloo");
  status.set_generation(3);
  status.set_group_ready(false);
  status.set_build_version("1.2.3");
  status.set_proto_version(1);
  v1::StreamStatus* stream = status.add_streams();
  stream->set_name("actor_update");
  stream->set_last_round(41);
  stream->set_rounds_completed(40);
  stream->set_rounds_failed(2);
  stream->set_last_round_duration_us(2500);
  (*status.mutable_counters()->mutable_errors_by_code())["ABORTED"] = 2;
  status.mutable_counters()->set_over_cap_parts(5);
  status.mutable_counters()->set_over_cap_unavoidable_parts(5);
  const std::string table = StatusTable(status);
  // Over the cap, unavoidable (one overlong sequence each) apart from avoidable.
  EXPECT_THAT(table, HasSubstr("5 micro-batches: 5 unavoidable (one overlong sequence each), 0 "
                               "avoidable\n"));
  EXPECT_THAT(table, HasSubstr("rank 1 of 4, backend gloo, generation 3, NOT READY"));
  EXPECT_THAT(table, HasSubstr("ABORTED 2"));
  EXPECT_THAT(table, ::testing::ContainsRegex("actor_update +41 +40 +2 +0 +0 +2.50"));
}

// --status against nothing listening: exit 1.
TEST(RunStatus, FailsWhenNothingAnswers) {
  StatusFlags flags;
  flags.target = "127.0.0.1:1";
  EXPECT_EQ(RunStatus(flags), 1);
}

// Metrics are made only with --metrics_listen.
TEST(Metrics, OffWithoutAListenAddress) {
  service::ServerOptions options;
  EXPECT_EQ(MakeMetrics(MetricsFlags{}, options), nullptr);
  EXPECT_NE(MakeMetrics(MetricsFlags{"127.0.0.1:0", ""}, options), nullptr);
}

// The scrape-time gauges from the coordinator's figures.
TEST(Metrics, SnapshotSumsTheStreams) {
  service::RoundCoordinator::Stats stats;
  stats.streams.resize(2);
  stats.streams[0].outstanding = 3;
  stats.streams[0].running = 1;
  stats.streams[0].cached = 4;
  stats.streams[1].outstanding = 1;
  stats.streams[1].cached = 2;
  stats.generation = 5;
  stats.backend = "gloo";
  const metrics::Snapshot s = SnapshotOf(stats, nullptr);
  EXPECT_EQ(s.rounds_running, 1);
  EXPECT_EQ(s.rounds_queued, 3);
  EXPECT_EQ(s.cache_entries, 6);
  EXPECT_EQ(s.streams, 2);
  EXPECT_EQ(s.generation, 5);
  EXPECT_EQ(s.backend, "gloo");
  for (const auto& [method, count] : s.store_requests) {
    EXPECT_EQ(count, 0) << method;  // a group of one has no store
  }
  collective::InMemoryStore store;
  collective::CountingStore counted(store);
  ASSERT_TRUE(counted.Set("k", "v", absl::InfiniteFuture()).ok());
  ASSERT_TRUE(counted.TryGet("k", absl::InfiniteFuture()).ok());
  ASSERT_TRUE(counted.TryGet("other", absl::InfiniteFuture()).ok());
  const metrics::Snapshot with_store = SnapshotOf(stats, &counted);
  EXPECT_THAT(
      with_store.store_requests,
      ::testing::ElementsAre(::testing::Pair("set", 1), ::testing::Pair("get", 0),
                             ::testing::Pair("try_get", 2), ::testing::Pair("compare_and_set", 0),
                             ::testing::Pair("delete_prefix", 0)));
}

}  // namespace
}  // namespace packsched::sidecar
