// End to end: PlanDynamicCp through a rank group of real packsched-server processes (Gloo on
// loopback), one C++ client per rank, each asking its own sidecar for its own view of the same
// step: every rank gets the same plan — the in-process planner's — and every sequence runs
// exactly once, reaching its group from its owner. With a stream, the sidecars agree the step in
// one round: a rank that sent another step fails it on every rank.

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/scheduler_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/dynamic_cp.h"
#include "tests/e2e/server_process.h"

namespace packsched {
namespace {

using ::packsched::client::ClientOptions;
using ::packsched::client::CpRankSlot;
using ::packsched::client::DynamicCpRequest;
using ::packsched::client::DynamicCpResult;
using ::packsched::client::SchedulerClient;
using ::packsched::testing::FreePort;
using ::packsched::testing::ServerProcess;
using ::testing::HasSubstr;

constexpr int64_t kWorld = 4;

class DynamicCpE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string rendezvous = absl::StrCat("127.0.0.1:", FreePort());
    for (int64_t rank = kWorld - 1; rank >= 0; --rank) {  // rank 0 (the store) last
      servers_[rank] = std::make_unique<ServerProcess>(std::vector<std::string>{
          absl::StrCat("--rank=", rank), absl::StrCat("--world_size=", kWorld),
          absl::StrCat("--rendezvous=", rendezvous), "--backend=gloo", "--log_level=warn"});
    }
    for (int64_t rank = 0; rank < kWorld; ++rank) {
      ASSERT_TRUE(servers_[rank]->started()) << servers_[rank]->stderr_text();
      ClientOptions options;
      options.target = servers_[rank]->target();
      options.timeout = absl::Seconds(30);
      absl::StatusOr<std::unique_ptr<SchedulerClient>> c = SchedulerClient::Create(options);
      ASSERT_TRUE(c.ok()) << c.status();
      clients_[rank] = *std::move(c);
    }
  }

  std::unique_ptr<ServerProcess> servers_[kWorld];
  std::unique_ptr<SchedulerClient> clients_[kWorld];
};

TEST_F(DynamicCpE2eTest, EveryRankGetsTheSamePlanAndEverySequenceRunsOnce) {
  std::mt19937_64 rng(20261207);
  std::lognormal_distribution<double> length(7.6, 1.0);
  std::uniform_int_distribution<int64_t> owner(0, kWorld - 1);
  DynamicCpRequest request;
  for (int i = 0; i < 150; ++i) {
    request.lengths.push_back(std::clamp<int64_t>(static_cast<int64_t>(length(rng)), 16, 30000));
    request.owner_ranks.push_back(owner(rng));
    request.loss_tokens.push_back(request.lengths.back() / 2);
  }
  request.options.ranks = kWorld;
  request.options.max_tokens_per_rank = 9000;
  request.options.cost = {.linear = 2048, .quadratic = 1, .comm = 300};

  std::vector<DynamicCpResult> results;
  for (int64_t rank = 0; rank < kWorld; ++rank) {
    DynamicCpRequest mine = request;
    mine.rank = rank;
    absl::StatusOr<DynamicCpResult> r = clients_[rank]->PlanDynamicCp(mine);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->ranks.size(), 1u);
    EXPECT_EQ(r->ranks[0].rank, rank);
    results.push_back(*std::move(r));
  }
  absl::StatusOr<planner::DynamicCpPlan> local =
      planner::PlanDynamicCp(request.lengths, request.options);
  ASSERT_TRUE(local.ok()) << local.status();
  for (const DynamicCpResult& r : results) {
    EXPECT_EQ(r.plan_fingerprint, results[0].plan_fingerprint);
    EXPECT_EQ(r.group_names, local->group_names);
    EXPECT_EQ(r.num_micro_batches, static_cast<int64_t>(local->slots.size()));
    EXPECT_EQ(r.step_cost, local->step_cost);
    EXPECT_EQ(r.cp_of_sequence, local->cp_of_sequence);
  }
  // Every rank's slots are its groups in the in-process plan; the group's first member runs
  // each sequence once; the owner and index name it in the owner's own list.
  std::map<int64_t, std::vector<int64_t>> by_owner;
  for (size_t i = 0; i < request.owner_ranks.size(); ++i) {
    by_owner[request.owner_ranks[i]].push_back(static_cast<int64_t>(i));
  }
  std::vector<int64_t> runs;
  for (int64_t rank = 0; rank < kWorld; ++rank) {
    const std::vector<CpRankSlot>& slots = results[rank].ranks[0].slots;
    ASSERT_EQ(slots.size(), local->slots.size());
    for (size_t s = 0; s < slots.size(); ++s) {
      const planner::CpGroupPlan* group = nullptr;
      for (const planner::CpGroupPlan& g : local->slots[s].groups) {
        if (g.first_rank <= rank && rank < g.first_rank + g.size) group = &g;
      }
      ASSERT_NE(group, nullptr);
      const CpRankSlot& v = slots[s];
      EXPECT_EQ(v.group, group->name);
      EXPECT_EQ(v.first_rank, group->first_rank);
      EXPECT_EQ(v.size, group->size);
      EXPECT_EQ(v.cp_rank, rank - group->first_rank);
      EXPECT_EQ(v.sequences, group->sequences);
      EXPECT_EQ(v.cu_seqlens, group->cu_seqlens);
      EXPECT_EQ(v.shard_chunks, (std::vector<int64_t>{v.cp_rank, 2 * v.size - 1 - v.cp_rank}));
      ASSERT_EQ(v.owner_ranks.size(), v.sequences.size());
      ASSERT_EQ(v.loss_weights.size(), v.sequences.size());
      for (size_t j = 0; j < v.sequences.size(); ++j) {
        EXPECT_EQ(by_owner[v.owner_ranks[j]][v.owner_indices[j]], v.sequences[j]);
      }
      if (v.cp_rank == 0) runs.insert(runs.end(), v.sequences.begin(), v.sequences.end());
    }
  }
  std::sort(runs.begin(), runs.end());
  std::vector<int64_t> every(request.lengths.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int64_t>(i);
  EXPECT_EQ(runs, every);
  absl::StatusOr<client::ServerStatus> status = clients_[2]->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->dynamic_cp_plans, 1);
}

TEST_F(DynamicCpE2eTest, AnOptionOrASequenceThePlannerRefusesIsNamed) {
  DynamicCpRequest request;
  request.lengths = {300, 900};
  request.options.ranks = kWorld;
  request.options.max_tokens_per_rank = 1000;
  request.options.max_cp = 3;
  absl::StatusOr<DynamicCpResult> r = clients_[0]->PlanDynamicCp(request);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("max_cp = 3: must divide ranks = 4"));

  request.options.max_cp = 2;
  request.options.max_tokens_per_rank = 200;
  r = clients_[1]->PlanDynamicCp(request);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("sequence 1 (length 900)"));
}

TEST_F(DynamicCpE2eTest, WithAStreamEveryRankAgreesTheStepOrEveryRankFails) {
  DynamicCpRequest request;
  request.lengths = {4000, 300, 9000, 1200, 700, 2500, 5100, 60};
  request.options.ranks = kWorld;
  request.options.max_tokens_per_rank = 3000;
  request.stream = "dcp";
  // Every rank at once (a round needs them all); `change` edits rank 1's request.
  const auto on_every_rank = [&](int64_t round, auto change) {
    std::vector<absl::StatusOr<DynamicCpResult>> out(kWorld, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int64_t rank = 0; rank < kWorld; ++rank) {
      threads.emplace_back([&, rank] {
        DynamicCpRequest mine = request;
        mine.rank = rank;
        mine.round = round;
        if (rank == 1) change(mine);
        out[rank] = clients_[rank]->PlanDynamicCp(mine);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  };
  const auto same = [](DynamicCpRequest&) {};
  std::vector<absl::StatusOr<DynamicCpResult>> agreed = on_every_rank(1, same);
  for (const absl::StatusOr<DynamicCpResult>& r : agreed) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->plan_fingerprint, agreed[0]->plan_fingerprint);
  }
  const std::vector<absl::StatusOr<DynamicCpResult>> refused =
      on_every_rank(2, [](DynamicCpRequest& mine) { mine.lengths[3] += 1; });
  for (const absl::StatusOr<DynamicCpResult>& r : refused) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(r.status().message(), HasSubstr("the ranks sent different steps"));
    EXPECT_THAT(r.status().message(), HasSubstr("rank 1 has fingerprint"));
  }
}

}  // namespace
}  // namespace packsched
