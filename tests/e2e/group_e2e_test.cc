// End to end: rank groups of real packsched-server processes on loopback (Gloo, the rendezvous
// store served by rank 0), driven by one C++ client per rank. Agreement for W = 2, 4, 8, every
// failure case of the round protocol, healing after a peer dies, start order, two streams, and a
// restarted sidecar recovering a round its peers finished.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cpp/scheduler_client.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/planner/planner.h"
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
using ::testing::HasSubstr;

constexpr int64_t kCap = 18432;  // above the longest realistic sequence (18,000)
// Failure reports must come within the collective timeout plus this (process scheduling on a
// loaded 2-core CI machine, the store look-ups that name the missing ranks).
constexpr absl::Duration kMargin = absl::Milliseconds(1500);

// W sidecars sharing one rendezvous address; rank 0 serves the store.
class Cluster {
 public:
  Cluster(int64_t world_size, absl::Duration timeout, std::vector<int64_t> start_order = {},
          std::vector<std::string> extra = {}, ClientOptions client_options = {},
          std::string rendezvous_host = "127.0.0.1")
      : world_size_(world_size),
        timeout_(timeout),
        extra_(std::move(extra)),
        client_options_(std::move(client_options)),
        rendezvous_(absl::StrCat(rendezvous_host, ":", FreePort())),
        servers_(world_size),
        clients_(world_size) {
    if (start_order.empty()) {
      for (int64_t r = world_size - 1; r >= 0; --r) start_order.push_back(r);  // rank 0 last
    }
    for (int64_t rank : start_order) Start(rank);
  }

  void Start(int64_t rank) {
    std::vector<std::string> flags = {
        absl::StrCat("--rank=", rank),
        absl::StrCat("--world_size=", world_size_),
        absl::StrCat("--rendezvous=", rendezvous_),
        absl::StrCat("--collective_timeout=", absl::FormatDuration(timeout_)),
        "--backend=gloo",
        "--log_level=warn"};
    flags.insert(flags.end(), extra_.begin(), extra_.end());
    servers_[rank] = std::make_unique<ServerProcess>(flags);
    ClientOptions options = client_options_;
    options.target = servers_[rank]->target();
    options.timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<SchedulerClient>> client = SchedulerClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (client.ok()) clients_[rank] = *std::move(client);
  }

  // SIGKILL: the peer dies without a goodbye.
  void Kill(int64_t rank) {
    kill(servers_[rank]->pid(), SIGKILL);
    servers_[rank]->Exited(absl::Seconds(10));
  }

  bool started() const {
    for (const auto& server : servers_) {
      if (server == nullptr || !server->started()) return false;
    }
    return true;
  }
  std::string Logs() {
    std::string logs;
    for (size_t r = 0; r < servers_.size(); ++r) {
      if (!servers_[r]) continue;
      absl::StrAppend(&logs, "--- rank ", r, ":\n", servers_[r]->stderr_text());
      if (servers_[r]->Exited(absl::ZeroDuration())) {
        absl::StrAppend(&logs, "(exited, wait status ", *servers_[r]->exit_status(), ")\n");
      }
    }
    return logs;
  }

  SchedulerClient& client(int64_t rank) { return *clients_[rank]; }
  bool servers_started(int64_t rank) const { return servers_[rank] && servers_[rank]->started(); }
  pid_t pid(int64_t rank) const { return servers_[rank]->pid(); }
  bool WaitExited(int64_t rank, absl::Duration timeout) { return servers_[rank]->Exited(timeout); }
  std::string target(int64_t rank) const { return servers_[rank]->target(); }
  const std::string& rendezvous() const { return rendezvous_; }
  int64_t world_size() const { return world_size_; }

 private:
  const int64_t world_size_;
  const absl::Duration timeout_;
  const std::vector<std::string> extra_;
  const ClientOptions client_options_;
  const std::string rendezvous_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::vector<std::unique_ptr<SchedulerClient>> clients_;
};

PlanRequest Request(const std::string& stream, int64_t round, int64_t rank, int64_t n = 256) {
  PlanRequest request;
  request.stream = stream;
  request.round = round;
  // Different lengths and counts per rank (and per round).
  request.lengths = testing::RealisticRlLengths(n + 61 * rank, 1000 * round + rank);
  request.options.max_token_len = kCap;
  for (int64_t length : request.lengths) request.loss_tokens.push_back((length + 1) / 2);
  return request;
}

struct Outcome {
  absl::StatusOr<PlanResult> result = absl::UnknownError("not run");
  absl::Duration took;
};

// Calls Plan on the given ranks concurrently; request(rank) builds each rank's request.
std::vector<Outcome> PlanOn(Cluster& cluster, const std::vector<int64_t>& ranks,
                            const std::function<PlanRequest(int64_t)>& request) {
  std::vector<Outcome> outcomes(cluster.world_size());
  std::vector<std::thread> threads;
  for (int64_t rank : ranks) {
    threads.emplace_back([&, rank] {
      const PlanRequest r = request(rank);
      const absl::Time start = absl::Now();
      outcomes[rank].result = cluster.client(rank).Plan(r);
      outcomes[rank].took = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  return outcomes;
}

std::vector<int64_t> AllRanks(int64_t world_size) {
  std::vector<int64_t> ranks(world_size);
  for (int64_t r = 0; r < world_size; ++r) ranks[r] = r;
  return ranks;
}

// The planner's guarantees for one rank's plan under an agreed k.
void ExpectValidPlan(const PlanRequest& request, const PlanResult& result, int64_t k) {
  EXPECT_EQ(result.num_micro_batches, k);
  EXPECT_GE(k, result.local_num_micro_batches);
  ASSERT_EQ(static_cast<int64_t>(result.plan.parts.size()), k);
  std::vector<int> seen(request.lengths.size(), 0);
  for (const auto& part : result.plan.parts) {
    int64_t tokens = 0;
    for (int64_t index : part.indices) {
      ASSERT_GE(index, 0);
      ASSERT_LT(index, static_cast<int64_t>(request.lengths.size()));
      ++seen[index];
      tokens += request.lengths[index];
    }
    EXPECT_EQ(tokens, part.tokens);
    // Within the cap, unless the part is one sequence longer than the cap.
    if (!(part.indices.size() == 1 && tokens > kCap)) {
      EXPECT_LE(tokens, kCap);
    }
  }
  for (int64_t index : result.plan.dropped) ++seen[index];
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "sequence " << i;
  ASSERT_EQ(result.loss_weights.size(), request.lengths.size());
}

void ExpectAgreed(Cluster& cluster, const std::vector<Outcome>& outcomes,
                  const std::function<PlanRequest(int64_t)>& request) {
  int64_t k = -1;
  int64_t max_local = 0;
  int64_t sequences = 0;
  for (int64_t r = 0; r < cluster.world_size(); ++r) {
    ASSERT_TRUE(outcomes[r].result.ok())
        << "rank " << r << ": " << outcomes[r].result.status() << "\n"
        << cluster.Logs();
    const PlanResult& result = *outcomes[r].result;
    if (k < 0) k = result.num_micro_batches;
    EXPECT_EQ(result.num_micro_batches, k) << "rank " << r;
    max_local = std::max(max_local, result.local_num_micro_batches);
    sequences += static_cast<int64_t>(request(r).lengths.size());
    EXPECT_EQ(result.global.world_size, cluster.world_size());
    ExpectValidPlan(request(r), result, k);
  }
  EXPECT_EQ(k, max_local);  // the largest local bound, nothing more
  for (int64_t r = 0; r < cluster.world_size(); ++r) {
    EXPECT_EQ(outcomes[r].result->global.num_sequences, sequences);
  }
}

TEST(GroupE2E, TwoFourAndEightRanksAgreeOnOneK) {
  for (int64_t world_size : {2, 4, 8}) {
    SCOPED_TRACE(world_size);
    // Rank 0 starts last for W = 2 and 8, in the middle for W = 4.
    std::vector<int64_t> order;
    if (world_size == 4) order = {3, 1, 0, 2};
    Cluster cluster(world_size, absl::Seconds(5), order);
    ASSERT_TRUE(cluster.started()) << cluster.Logs();
    for (int64_t round : {1, 2}) {
      auto request = [&](int64_t rank) { return Request("actor_update", round, rank); };
      ExpectAgreed(cluster, PlanOn(cluster, AllRanks(world_size), request), request);
    }
    for (int64_t r = 0; r < world_size; ++r) {
      absl::StatusOr<client::ServerStatus> status = cluster.client(r).GetStatus();
      ASSERT_TRUE(status.ok()) << status.status();
      EXPECT_EQ(status->rank, r);
      EXPECT_EQ(status->world_size, world_size);
      EXPECT_TRUE(status->group_ready);
      EXPECT_EQ(status->backend, "gloo");
      EXPECT_EQ(status->generation, 0);
    }
  }
}

// `packsched-server --probe=TARGET [--probe_service=S]`'s exit code: 0 iff S is SERVING there.
int Probe(const std::string& target, const std::string& service) {
  const std::string command = absl::StrCat(PACKSCHED_SERVER_PATH, " --probe=", target,
                                           " --probe_service=", service, " 2>/dev/null");
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(GroupE2E, ReadinessTurnsOnOnceEveryRankHasJoinedWithoutAnyPlan) {
  const std::string kScheduler = "packsched.v1.Scheduler";
  Cluster cluster(3, absl::Seconds(10), /*start_order=*/{0, 2});
  ASSERT_TRUE(cluster.client(0).GetStatus().ok()) << cluster.Logs();
  // Rank 1 is not up: both servers live (""), neither ready (the Scheduler service).
  absl::SleepFor(absl::Milliseconds(500));
  for (int64_t r : {0, 2}) {
    EXPECT_EQ(Probe(cluster.target(r), ""), 0) << "rank " << r;
    EXPECT_EQ(Probe(cluster.target(r), kScheduler), 1) << "rank " << r;
    absl::StatusOr<client::ServerStatus> status = cluster.client(r).GetStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_FALSE(status->group_ready) << "rank " << r;
  }

  cluster.Start(1);
  for (int64_t r = 0; r < 3; ++r) {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    int probe = -1;
    while ((probe = Probe(cluster.target(r), kScheduler)) != 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ(probe, 0) << "rank " << r << "\n" << cluster.Logs();
    absl::StatusOr<client::ServerStatus> status = cluster.client(r).GetStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(status->group_ready) << "rank " << r;
    EXPECT_TRUE(status->streams.empty());
  }
  // Nothing listens here: the probe fails rather than hangs.
  EXPECT_EQ(Probe(absl::StrCat("127.0.0.1:", FreePort()), ""), 1);
}

TEST(GroupE2E, AutoFallsBackToGlooWithoutAGpu) {
  Cluster cluster(2, absl::Seconds(5), {}, {"--backend=auto"});
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  auto request = [](int64_t rank) { return Request("actor_update", 1, rank); };
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1}, request), request);
  absl::StatusOr<client::ServerStatus> status = cluster.client(1).GetStatus();
  ASSERT_TRUE(status.ok());
  // This test machine has no GPU (CI); with one and an NCCL build, auto would choose NCCL.
  EXPECT_EQ(status->backend, "gloo");
}

// TLS on the rendezvous port (and the trainer port) with client certificates and the token.
TEST(GroupE2E, TheRendezvousPortSpeaksTlsWithClientCertificatesAndTheToken) {
  testing::TempDir dir;
  const std::string d = dir.path();
  const std::string script = absl::StrCat(
      "cd '", d, "' && exec > openssl.log 2>&1 && ",
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key "
      "-out ca.pem -days 1 -subj /CN=packsched-test-ca && ",
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout rank.key "
      "-out rank.csr -subj /CN=localhost && ",
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.ext && ",
      "openssl x509 -req -in rank.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out rank.pem "
      "-days 1 -extfile san.ext");
  if (std::system(script.c_str()) != 0) GTEST_SKIP() << "openssl could not make certificates";
  {
    std::ofstream token(dir.File("token"));
    token << "group-token";
  }
  ClientOptions client;
  client.tls_root_certs_file = dir.File("ca.pem");
  client.tls_client_cert_file = dir.File("rank.pem");
  client.tls_client_key_file = dir.File("rank.key");
  client.auth_token = "group-token";
  Cluster cluster(
      2, absl::Seconds(5), {},
      {"--rendezvous_tls", absl::StrCat("--rendezvous_tls_ca=", d, "/ca.pem"),
       absl::StrCat("--tls_cert=", d, "/rank.pem"), absl::StrCat("--tls_key=", d, "/rank.key"),
       absl::StrCat("--tls_client_ca=", d, "/ca.pem"),
       absl::StrCat("--auth_token_file=", d, "/token"), "--gloo_hostname=127.0.0.1"},
      client, "localhost");
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  auto request = [](int64_t rank) { return Request("actor_update", 1, rank); };
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1}, request), request);
}

TEST(GroupE2E, AMissingRankIsADeadlineNamingItAndEndsTheGeneration) {
  const absl::Duration timeout = absl::Seconds(1);
  Cluster cluster(3, timeout);
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  auto request = [](int64_t round) {
    return [round](int64_t rank) { return Request("actor_update", round, rank); };
  };
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1, 2}, request(1)), request(1));

  // Rank 2 never calls round 2.
  std::vector<Outcome> outcomes = PlanOn(cluster, {0, 1}, request(2));
  for (int64_t r : {0, 1}) {
    ASSERT_FALSE(outcomes[r].result.ok());
    EXPECT_EQ(outcomes[r].result.status().code(), absl::StatusCode::kDeadlineExceeded)
        << outcomes[r].result.status();
    EXPECT_THAT(outcomes[r].result.status().message(), HasSubstr("ranks [2] did not arrive"));
    EXPECT_LT(outcomes[r].took, timeout + kMargin);
  }
  // The timeout ended the generation: round 3 with every rank succeeds on a new one.
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1, 2}, request(3)), request(3));
  absl::StatusOr<client::ServerStatus> status = cluster.client(2).GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_GE(status->generation, 1);
}

TEST(GroupE2E, ARankThatNeverCallsIsNamedWhenTheGroupFirstForms) {
  const absl::Duration timeout = absl::Seconds(1);
  Cluster cluster(2, timeout);
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  std::vector<Outcome> outcomes =
      PlanOn(cluster, {0}, [](int64_t rank) { return Request("critic", 1, rank); });
  ASSERT_FALSE(outcomes[0].result.ok());
  EXPECT_EQ(outcomes[0].result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(outcomes[0].result.status().message(), HasSubstr("ranks [1] did not join"));
  EXPECT_LT(outcomes[0].took, timeout + kMargin);
}

// SIGTERM while a stream is forming the group (its worker blocked on the rendezvous store for a
// rank that never comes) stops within the shutdown grace period, not the collective timeout; the
// round's caller gets the service's own final answer (ABORTED, not retried), not gRPC's
// cancellation at the grace deadline (UNAVAILABLE without the served marker: retried).
TEST(GroupE2E, SigtermDuringGroupFormationStopsWithinTheGracePeriod) {
  Cluster cluster(2, absl::Seconds(60), /*start_order=*/{0}, {"--shutdown_grace=1s"});
  ASSERT_TRUE(cluster.servers_started(0)) << cluster.Logs();
  Outcome outcome;
  std::thread caller([&] {
    const absl::Time start = absl::Now();
    outcome.result = cluster.client(0).Plan(Request("critic", 1, 0));
    outcome.took = absl::Now() - start;
  });
  // Until the round is outstanding (its worker is forming the group, waiting for rank 1).
  bool outstanding = false;
  for (int i = 0; i < 1000 && !outstanding; ++i) {
    const absl::StatusOr<client::ServerStatus> status = cluster.client(0).GetStatus();
    outstanding = status.ok() && !status->streams.empty() && status->streams[0].outstanding == 1;
    if (!outstanding) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(outstanding) << cluster.Logs();
  kill(cluster.pid(0), SIGTERM);
  const bool exited = cluster.WaitExited(0, absl::Seconds(10));  // a bound, not a target
  caller.join();
  ASSERT_TRUE(exited) << cluster.Logs();
  ASSERT_FALSE(outcome.result.ok());
  EXPECT_EQ(outcome.result.status().code(), absl::StatusCode::kAborted) << outcome.result.status();
  EXPECT_THAT(outcome.result.status().message(), HasSubstr("round 1 was abandoned"));
}

TEST(GroupE2E, AnInvalidRequestOnOneRankFailsEveryRankAtOnceWithItsError) {
  const absl::Duration timeout = absl::Seconds(2);
  Cluster cluster(3, timeout);
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  auto good = [](int64_t rank) { return Request("actor_update", 1, rank); };
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1, 2}, good), good);
  std::vector<Outcome> outcomes = PlanOn(cluster, {0, 1, 2}, [](int64_t rank) {
    PlanRequest request = Request("actor_update", 2, rank);
    if (rank == 1) request.lengths[3] = -5;
    return request;
  });
  for (int64_t r = 0; r < 3; ++r) {
    ASSERT_FALSE(outcomes[r].result.ok());
    EXPECT_EQ(outcomes[r].result.status().code(), absl::StatusCode::kInvalidArgument)
        << outcomes[r].result.status();
    EXPECT_THAT(outcomes[r].result.status().message(), HasSubstr("rank 1"));
    EXPECT_THAT(outcomes[r].result.status().message(), HasSubstr("-5"));
    EXPECT_LT(outcomes[r].took, timeout / 2);  // at once, not at the timeout
  }
  // Options only the bad rank gets wrong: its error, not an options mismatch, on every rank.
  outcomes = PlanOn(cluster, {0, 1, 2}, [](int64_t rank) {
    PlanRequest request = Request("actor_update", 3, rank);
    if (rank == 2) request.options.max_token_len = -1;
    return request;
  });
  for (int64_t r = 0; r < 3; ++r) {
    ASSERT_FALSE(outcomes[r].result.ok());
    EXPECT_EQ(outcomes[r].result.status().code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << outcomes[r].result.status();
    EXPECT_THAT(outcomes[r].result.status().message(), HasSubstr("rank 2"));
  }
}

TEST(GroupE2E, AKAboveMaxMicroBatchesOnOneRankFailsTheRoundOnEveryRank) {
  Cluster cluster(2, absl::Seconds(2));
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  // Each rank's own count, from the planner in this process; the ceiling sits between them.
  std::vector<int64_t> local(2);
  for (int64_t r : {0, 1}) {
    const PlanRequest request = Request("actor_update", 1, r, r == 0 ? 200 : 900);
    absl::StatusOr<planner::MicroBatchPlan> alone =
        planner::PlanMicroBatches(request.lengths, request.options);
    ASSERT_TRUE(alone.ok()) << alone.status();
    local[r] = static_cast<int64_t>(alone->parts.size());
  }
  ASSERT_LT(local[0], local[1]);
  std::vector<Outcome> outcomes = PlanOn(cluster, {0, 1}, [&](int64_t rank) {
    PlanRequest request = Request("actor_update", 1, rank, rank == 0 ? 200 : 900);
    request.options.max_micro_batches = local[0];  // same options on both ranks
    return request;
  });
  for (int64_t r : {0, 1}) {
    ASSERT_FALSE(outcomes[r].result.ok()) << "rank " << r;
    EXPECT_EQ(outcomes[r].result.status().code(), absl::StatusCode::kInvalidArgument)
        << outcomes[r].result.status();
    EXPECT_THAT(outcomes[r].result.status().message(), HasSubstr("rank 1"));
    EXPECT_THAT(outcomes[r].result.status().message(), HasSubstr("max_micro_batches"));
  }
  EXPECT_EQ(outcomes[0].result.status(), outcomes[1].result.status());
}

TEST(GroupE2E, MismatchedRoundsAndOptionsAreFailedPreconditionNamingBoth) {
  Cluster cluster(2, absl::Seconds(2));
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  std::vector<Outcome> rounds = PlanOn(cluster, {0, 1}, [](int64_t rank) {
    return Request("actor_update", rank == 0 ? 4 : 5, rank);
  });
  for (int64_t r : {0, 1}) {
    ASSERT_FALSE(rounds[r].result.ok());
    EXPECT_EQ(rounds[r].result.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(rounds[r].result.status().message(), HasSubstr("rank 0 has 4, rank 1 has 5"));
  }
  std::vector<Outcome> options = PlanOn(cluster, {0, 1}, [](int64_t rank) {
    PlanRequest request = Request("actor_update", 6, rank);
    if (rank == 1) request.options.max_token_len = kCap + 1024;  // valid, but different
    return request;
  });
  for (int64_t r : {0, 1}) {
    ASSERT_FALSE(options[r].result.ok());
    EXPECT_EQ(options[r].result.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(options[r].result.status().message(), HasSubstr("disagree on the options"));
    EXPECT_THAT(options[r].result.status().message(), HasSubstr("rank 1 has fingerprint"));
  }
}

TEST(GroupE2E, APeerKilledMidRoundAbortsItAndTheRestartedPeerHealsTheGroup) {
  const absl::Duration timeout = absl::Seconds(2);
  Cluster cluster(3, timeout);
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  auto request = [](int64_t round) {
    return [round](int64_t rank) { return Request("actor_update", round, rank); };
  };
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1, 2}, request(1)), request(1));

  // Ranks 0 and 1 wait in round 2 when rank 2 dies.
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(300));
    cluster.Kill(2);
  });
  std::vector<Outcome> outcomes = PlanOn(cluster, {0, 1}, request(2));
  killer.join();
  for (int64_t r : {0, 1}) {
    ASSERT_FALSE(outcomes[r].result.ok());
    EXPECT_EQ(outcomes[r].result.status().code(), absl::StatusCode::kAborted)
        << outcomes[r].result.status();
    EXPECT_LT(outcomes[r].took, timeout + kMargin);
  }
  // The peer comes back (survivors keep running); the next round succeeds on a new generation.
  cluster.Start(2);
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1, 2}, request(3)), request(3));
  absl::StatusOr<client::ServerStatus> status = cluster.client(0).GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_GE(status->generation, 1);
}

TEST(GroupE2E, APeerKilledBetweenRoundsAbortsTheNextAndHealsAfterRestart) {
  const absl::Duration timeout = absl::Seconds(2);
  Cluster cluster(2, timeout);
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  auto request = [](int64_t round) {
    return [round](int64_t rank) { return Request("actor_update", round, rank); };
  };
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1}, request(1)), request(1));
  cluster.Kill(1);
  std::vector<Outcome> outcomes = PlanOn(cluster, {0}, request(2));
  ASSERT_FALSE(outcomes[0].result.ok());
  // Gloo sees the closed connection (Aborted), or, if the loss goes unnoticed, the round times
  // out naming rank 1 (DeadlineExceeded); either way the generation ends.
  EXPECT_THAT(outcomes[0].result.status().code(),
              ::testing::AnyOf(absl::StatusCode::kAborted, absl::StatusCode::kDeadlineExceeded))
      << outcomes[0].result.status();
  EXPECT_LT(outcomes[0].took, timeout + kMargin);
  cluster.Start(1);
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1}, request(3)), request(3));
}

TEST(GroupE2E, APeerRestartedBeforeItsPeersNextRoundCostsThemNoRound) {
  Cluster cluster(3, absl::Seconds(5));
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  auto request = [](int64_t round) {
    return [round](int64_t rank) { return Request("actor_update", round, rank); };
  };
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1, 2}, request(1)), request(1));
  cluster.Kill(1);
  cluster.Start(1);
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  // The restarted rank comes to round 2 first: it ends the generation its old self was in.
  std::vector<Outcome> restarted;
  std::thread first([&] { restarted = PlanOn(cluster, {1}, request(2)); });
  absl::SleepFor(absl::Milliseconds(500));
  // The survivors still hold that generation: their first attempt fails on the closed
  // connections, finds it ended by the restart, and runs the round on the next one.
  std::vector<Outcome> outcomes = PlanOn(cluster, {0, 2}, request(2));
  first.join();
  outcomes[1] = restarted[1];
  ExpectAgreed(cluster, outcomes, request(2));
  ExpectAgreed(cluster, PlanOn(cluster, {0, 1, 2}, request(3)), request(3));
}

TEST(GroupE2E, TwoStreamsInterleavedInOppositeOrders) {
  Cluster cluster(2, absl::Seconds(5));
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  for (int64_t round = 1; round <= 3; ++round) {
    // Rank 0 sends actor then critic; rank 1 critic then actor (each while the other waits).
    std::vector<absl::StatusOr<PlanResult>> results(4, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int64_t rank : {0, 1}) {
      const std::vector<std::string> order = rank == 0
                                                 ? std::vector<std::string>{"actor", "critic"}
                                                 : std::vector<std::string>{"critic", "actor"};
      for (int i = 0; i < 2; ++i) {
        threads.emplace_back([&, rank, i, stream = order[i]] {
          absl::SleepFor(absl::Milliseconds(150 * i));
          results[rank * 2 + (stream == "actor" ? 0 : 1)] =
              cluster.client(rank).Plan(Request(stream, round, rank));
        });
      }
    }
    for (std::thread& t : threads) t.join();
    for (int stream = 0; stream < 2; ++stream) {
      ASSERT_TRUE(results[stream].ok()) << results[stream].status() << cluster.Logs();
      ASSERT_TRUE(results[2 + stream].ok()) << results[2 + stream].status();
      EXPECT_EQ(results[stream]->num_micro_batches, results[2 + stream]->num_micro_batches);
    }
  }
}

TEST(GroupE2E, ARestartedRankRecoversARoundItsPeersFinished) {
  Cluster cluster(2, absl::Seconds(2));
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  auto request = [](int64_t round) {
    return [round](int64_t rank) {
      PlanRequest r = Request("actor_update", round, rank, rank == 0 ? 900 : 200);
      return r;
    };
  };
  std::vector<Outcome> first = PlanOn(cluster, {0, 1}, request(1));
  ExpectAgreed(cluster, first, request(1));
  // Rank 1's bound is below the agreed k (rank 0 has many more sequences).
  ASSERT_LT(first[1].result->local_num_micro_batches, first[1].result->num_micro_batches);

  // Rank 1 dies after the round and its trainer asks the new sidecar for round 1 again.
  cluster.Kill(1);
  cluster.Start(1);
  ASSERT_TRUE(cluster.started()) << cluster.Logs();
  std::vector<Outcome> again = PlanOn(cluster, {1}, request(1));
  ASSERT_TRUE(again[1].result.ok()) << again[1].result.status() << cluster.Logs();
  const PlanResult& recovered = *again[1].result;
  EXPECT_EQ(recovered.num_micro_batches, first[1].result->num_micro_batches);
  EXPECT_EQ(recovered.global.num_sequences, first[1].result->global.num_sequences);
  ASSERT_EQ(recovered.plan.parts.size(), first[1].result->plan.parts.size());
  for (size_t p = 0; p < recovered.plan.parts.size(); ++p) {
    EXPECT_EQ(recovered.plan.parts[p].indices, first[1].result->plan.parts[p].indices);
  }
  EXPECT_EQ(recovered.loss_weights, first[1].result->loss_weights);
  EXPECT_LT(again[1].took, absl::Seconds(1));  // no waiting for peers that will not come

  // And the group goes on. Rank 0 may not have noticed the restart yet: its first try can fail
  // with ABORTED on the old generation's connections (the trainer sends the round again), while
  // rank 1 is already forming the new generation, which rank 0's second try joins.
  std::vector<Outcome> next(2);
  std::thread rank1([&] { next[1].result = cluster.client(1).Plan(request(2)(1)); });
  next[0].result = cluster.client(0).Plan(request(2)(0));
  if (!next[0].result.ok() && absl::IsAborted(next[0].result.status())) {
    next[0].result = cluster.client(0).Plan(request(2)(0));
  }
  rank1.join();
  ExpectAgreed(cluster, next, request(2));
}

}  // namespace
}  // namespace packsched
