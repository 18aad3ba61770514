// End to end: how a rank group of real packsched-server processes (Gloo on loopback) fails when
// a peer dies during formation or rank 0 (which serves the rendezvous store) is stopped, and
// whether readiness comes back after rank 0 restarts. Each failure is reported within the
// collective timeout plus a margin, naming the right culprit.

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/scheduler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/server_process.h"
#include "tests/testing/lengths.h"

namespace packsched {
namespace {

using ::packsched::client::ClientOptions;
using ::packsched::client::PlanRequest;
using ::packsched::client::PlanResult;
using ::packsched::client::SchedulerClient;
using ::packsched::testing::FreePort;
using ::packsched::testing::ServerProcess;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(2);
// Cleanup (750 ms at most), naming the culprit, process scheduling on a loaded 2-core machine.
constexpr absl::Duration kMargin = absl::Milliseconds(1500);

class Group {
 public:
  explicit Group(int64_t world_size)
      : world_size_(world_size),
        rendezvous_(absl::StrCat("127.0.0.1:", FreePort())),
        servers_(world_size),
        clients_(world_size) {
    for (int64_t r = world_size - 1; r >= 0; --r) Start(r);
  }
  void Start(int64_t rank) {
    servers_[rank] = std::make_unique<ServerProcess>(std::vector<std::string>{
        absl::StrCat("--rank=", rank), absl::StrCat("--world_size=", world_size_),
        absl::StrCat("--rendezvous=", rendezvous_),
        absl::StrCat("--collective_timeout=", absl::FormatDuration(kTimeout)), "--backend=gloo",
        "--log_level=warn"});
    ClientOptions options;
    options.target = servers_[rank]->target();
    options.timeout = absl::Seconds(30);
    auto client = SchedulerClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (client.ok()) clients_[rank] = *std::move(client);
  }
  void Signal(int64_t rank, int signal) { kill(servers_[rank]->pid(), signal); }
  void Kill(int64_t rank) {
    Signal(rank, SIGKILL);
    servers_[rank]->Exited(absl::Seconds(10));
  }
  bool started() const {
    for (const auto& server : servers_) {
      if (server == nullptr || !server->started()) return false;
    }
    return true;
  }
  std::string Logs() const {
    std::string logs;
    for (size_t r = 0; r < servers_.size(); ++r) {
      absl::StrAppend(&logs, "--- rank ", r, ":\n", servers_[r]->stderr_text());
    }
    return logs;
  }
  SchedulerClient& client(int64_t rank) { return *clients_[rank]; }
  std::string target(int64_t rank) const { return servers_[rank]->target(); }

 private:
  const int64_t world_size_;
  const std::string rendezvous_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::vector<std::unique_ptr<SchedulerClient>> clients_;
};

PlanRequest Request(int64_t round, int64_t rank) {
  PlanRequest request;
  request.stream = "actor";
  request.round = round;
  request.lengths = testing::RealisticRlLengths(128 + 17 * rank, 1000 * round + rank);
  request.options.max_token_len = 18432;
  return request;
}

struct Outcome {
  absl::StatusOr<PlanResult> result = absl::UnknownError("not run");
  absl::Duration took;
};

std::vector<Outcome> PlanOn(Group& group, const std::vector<int64_t>& ranks, int64_t round) {
  std::vector<Outcome> outcomes(*std::max_element(ranks.begin(), ranks.end()) + 1);
  std::vector<std::thread> threads;
  for (int64_t rank : ranks) {
    threads.emplace_back([&, rank] {
      const absl::Time start = absl::Now();
      outcomes[rank].result = group.client(rank).Plan(Request(round, rank));
      outcomes[rank].took = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  return outcomes;
}

// Exit code of `packsched-server --probe`: 0 iff the Scheduler service is SERVING (ready).
int ProbeReady(const std::string& target) {
  const std::string command = absl::StrCat(PACKSCHED_SERVER_PATH, " --probe=", target,
                                           " --probe_service=packsched.v1.Scheduler 2>/dev/null");
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Rank 2 comes to form the stream's first generation, publishes its addresses, and is killed
// before its peers come to connect: they fail by the timeout (not 5 x the timeout), naming it.
TEST(GroupFailureE2E, APeerKilledDuringFormationIsNamedWithinTheTimeout) {
  Group group(3);
  ASSERT_TRUE(group.started()) << group.Logs();
  // Its own client gives up soon: the default one would retry the dead sidecar for 30 s.
  ClientOptions options;
  options.target = group.target(2);
  options.timeout = absl::Seconds(1);
  auto doomed_client = SchedulerClient::Create(options);
  ASSERT_TRUE(doomed_client.ok()) << doomed_client.status();
  std::thread doomed([&] { (*doomed_client)->Plan(Request(1, 2)).status().IgnoreError(); });
  absl::SleepFor(absl::Milliseconds(500));
  group.Kill(2);
  doomed.join();
  std::vector<Outcome> outcomes = PlanOn(group, {0, 1}, 1);
  for (int64_t r : {0, 1}) {
    ASSERT_FALSE(outcomes[r].result.ok()) << "rank " << r;
    const absl::Status& status = outcomes[r].result.status();
    EXPECT_THAT(status.code(),
                AnyOf(absl::StatusCode::kAborted, absl::StatusCode::kDeadlineExceeded))
        << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("ranks [2]")) << status;
    EXPECT_LT(outcomes[r].took, kTimeout + kMargin) << "rank " << r << ": " << status;
  }
}

// SIGSTOP on rank 0: the survivors' round times out and they blame the store, not themselves,
// within the timeout plus the margin.
TEST(GroupFailureE2E, AStoppedRankZeroIsReportedAsTheStoreWithinTheTimeout) {
  Group group(3);
  ASSERT_TRUE(group.started()) << group.Logs();
  for (const Outcome& o : PlanOn(group, {0, 1, 2}, 1)) {
    ASSERT_TRUE(o.result.ok()) << o.result.status() << group.Logs();
  }
  group.Signal(0, SIGSTOP);
  std::vector<Outcome> outcomes = PlanOn(group, {1, 2}, 2);
  group.Signal(0, SIGCONT);
  for (int64_t r : {1, 2}) {
    ASSERT_FALSE(outcomes[r].result.ok()) << "rank " << r;
    const absl::Status& status = outcomes[r].result.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("rendezvous store (rank 0) unreachable"));
    EXPECT_LT(outcomes[r].took, kTimeout + kMargin) << "rank " << r << ": " << status;
  }
}

// Regression: between generations (a peer died, the next round has not formed the group again)
// GetStatus said group_ready = false while the readiness probe still said SERVING. Both say
// not ready until the group forms again, then both say ready.
TEST(GroupFailureE2E, ReadinessAndGroupReadyAgreeBetweenGenerations) {
  Group group(3);
  ASSERT_TRUE(group.started()) << group.Logs();
  for (const Outcome& o : PlanOn(group, {0, 1, 2}, 1)) {
    ASSERT_TRUE(o.result.ok()) << o.result.status() << group.Logs();
  }
  group.Kill(2);
  for (const Outcome& o : PlanOn(group, {0, 1}, 2)) EXPECT_FALSE(o.result.ok());
  for (int64_t r : {0, 1}) {
    absl::StatusOr<client::ServerStatus> status = group.client(r).GetStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_FALSE(status->group_ready) << "rank " << r;
    EXPECT_EQ(ProbeReady(group.target(r)), 1) << "rank " << r;
  }

  group.Start(2);
  bool agreed = false;
  for (int64_t round = 3; round < 6 && !agreed; ++round) {
    agreed = true;
    for (const Outcome& o : PlanOn(group, {0, 1, 2}, round)) agreed &= o.result.ok();
  }
  ASSERT_TRUE(agreed) << group.Logs();
  for (int64_t r = 0; r < 3; ++r) {
    absl::StatusOr<client::ServerStatus> status = group.client(r).GetStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(status->group_ready) << "rank " << r;
    EXPECT_EQ(ProbeReady(group.target(r)), 0) << "rank " << r;
  }
}

// After rank 0 restarts (new epoch, empty store) and the group forms again, every rank's
// readiness probe is SERVING, and GetStatus agrees.
TEST(GroupFailureE2E, ReadinessComesBackAfterRankZeroRestarts) {
  Group group(3);
  ASSERT_TRUE(group.started()) << group.Logs();
  for (const Outcome& o : PlanOn(group, {0, 1, 2}, 1)) {
    ASSERT_TRUE(o.result.ok()) << o.result.status() << group.Logs();
  }
  group.Kill(0);
  group.Start(0);
  bool agreed = false;
  for (int64_t round = 2; round < 5 && !agreed; ++round) {  // the first may abort on the old group
    agreed = true;
    for (const Outcome& o : PlanOn(group, {0, 1, 2}, round)) agreed &= o.result.ok();
  }
  ASSERT_TRUE(agreed) << group.Logs();
  for (int64_t r = 0; r < 3; ++r) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    int probe = -1;
    while ((probe = ProbeReady(group.target(r))) != 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_EQ(probe, 0) << "rank " << r << "\n" << group.Logs();
    absl::StatusOr<client::ServerStatus> status = group.client(r).GetStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(status->group_ready) << "rank " << r;
  }
}

// The same plan: the same agreed count, the same micro-batches (indices), the same global counts
// and loss weights.
void ExpectSamePlan(const PlanResult& got, const PlanResult& want) {
  EXPECT_EQ(got.num_micro_batches, want.num_micro_batches);
  ASSERT_EQ(got.plan.parts.size(), want.plan.parts.size());
  for (size_t i = 0; i < got.plan.parts.size(); ++i) {
    EXPECT_EQ(got.plan.parts[i].indices, want.plan.parts[i].indices) << "micro-batch " << i;
  }
  EXPECT_EQ(got.global.num_sequences, want.global.num_sequences);
  EXPECT_EQ(got.global.loss_tokens, want.global.loss_tokens);
  EXPECT_EQ(got.global.world_size, want.global.world_size);
  EXPECT_EQ(got.loss_weights, want.loss_weights);
}

// Agreed results survive the loss of any one sidecar (docs/design.md §3): for every rank r of a
// group of 4, round n finished on every rank; r's sidecar is killed -9 and restarted with the same
// flags; r's trainer alone asks for round n again while the others stay idle, and gets the same
// plan within the collective timeout — rank 0 included, whose store restarts empty.
TEST(GroupFailureE2E, AKilledAndRestartedRankAloneGetsTheAgreedPlanWhicheverRankItIs) {
  Group group(4);
  ASSERT_TRUE(group.started()) << group.Logs();
  int64_t round = 1;
  for (int64_t killed = 0; killed < 4; ++killed, ++round) {
    SCOPED_TRACE(absl::StrCat("killed rank ", killed, ", round ", round));
    // Round n on every rank (the first after a restart may fail once on the old generation).
    std::vector<Outcome> finished;
    for (int attempt = 0; attempt < 3; ++attempt) {
      finished = PlanOn(group, {0, 1, 2, 3}, round);
      bool all = true;
      for (const Outcome& o : finished) all &= o.result.ok();
      if (all) break;
    }
    for (const Outcome& o : finished)
      ASSERT_TRUE(o.result.ok()) << o.result.status() << group.Logs();
    group.Kill(killed);
    group.Start(killed);
    ASSERT_TRUE(group.started()) << group.Logs();
    const std::vector<Outcome> again = PlanOn(group, {killed}, round);
    ASSERT_TRUE(again[killed].result.ok()) << again[killed].result.status() << group.Logs();
    ExpectSamePlan(*again[killed].result, *finished[killed].result);
    EXPECT_LT(again[killed].took, kTimeout + kMargin);
  }
}

// Round n finished on every rank of a group of 4.
std::vector<Outcome> FinishRound(Group& group, int64_t round) {
  std::vector<Outcome> finished;
  for (int attempt = 0; attempt < 3; ++attempt) {  // the first may abort on an old generation
    finished = PlanOn(group, {0, 1, 2, 3}, round);
    bool all = true;
    for (const Outcome& o : finished) all &= o.result.ok();
    if (all) break;
  }
  return finished;
}

// The invariant without rank 0's store: rank 2 is down (killed, not restarted) when rank 0 is
// killed and restarted with an empty store; rank 0 asks for the finished round again and gets
// the agreed plan from the live ranks' replicas (ranks 1 and 3), within the collective timeout.
TEST(GroupFailureE2E, ARestartedRankZeroAnswersAFinishedRoundWhileARankIsDown) {
  Group group(4);
  ASSERT_TRUE(group.started()) << group.Logs();
  const std::vector<Outcome> finished = FinishRound(group, 1);
  for (const Outcome& o : finished) ASSERT_TRUE(o.result.ok()) << o.result.status() << group.Logs();
  group.Kill(2);
  group.Kill(0);
  group.Start(0);
  ASSERT_TRUE(group.started()) << group.Logs();
  for (int resend = 0; resend < 2; ++resend) {  // every resend, not just the first
    const std::vector<Outcome> again = PlanOn(group, {0}, 1);
    ASSERT_TRUE(again[0].result.ok()) << again[0].result.status() << group.Logs();
    ExpectSamePlan(*again[0].result, *finished[0].result);
    EXPECT_LT(again[0].took, kTimeout + kMargin);
  }
}

// A rank restarted together with rank 0 finds the round the live ranks finished on its first
// resend, without running it (which would fail after a whole collective timeout, naming healthy
// ranks): ranks 0 and 2 killed and restarted, rank 2 alone asks again.
TEST(GroupFailureE2E, ARankRestartedWithRankZeroFindsTheResultOnItsFirstResend) {
  Group group(4);
  ASSERT_TRUE(group.started()) << group.Logs();
  const std::vector<Outcome> finished = FinishRound(group, 1);
  for (const Outcome& o : finished) ASSERT_TRUE(o.result.ok()) << o.result.status() << group.Logs();
  group.Kill(0);
  group.Kill(2);
  group.Start(0);
  group.Start(2);
  ASSERT_TRUE(group.started()) << group.Logs();
  const std::vector<Outcome> again = PlanOn(group, {2}, 1);
  ASSERT_TRUE(again[2].result.ok()) << again[2].result.status() << group.Logs();
  ExpectSamePlan(*again[2].result, *finished[2].result);
  EXPECT_LT(again[2].took, kTimeout) << "the resend spent a collective timeout";
  // And rank 0, restarted too, answers it from the same replicas.
  const std::vector<Outcome> zero = PlanOn(group, {0}, 1);
  ASSERT_TRUE(zero[0].result.ok()) << zero[0].result.status() << group.Logs();
  ExpectSamePlan(*zero[0].result, *finished[0].result);
}

}  // namespace
}  // namespace packsched
