// A seeded random fuzz driver for request validation: thousands of random requests (bad values
// of every field, random sizes, random bytes on the wire). Validation never crashes and answers
// OK, InvalidArgument or ResourceExhausted; whatever it accepts, the planner then plans or
// rejects with InvalidArgument — never anything else.

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "server/planner/tree_plan.h"
#include "server/service/balance_batch.h"
#include "server/service/convert.h"
#include "server/service/dynamic_cp.h"
#include "server/service/partition.h"
#include "server/service/request_memory.h"
#include "tests/testing/soak.h"

namespace packsched::service {
namespace {

class RandomRequests {
 public:
  explicit RandomRequests(uint64_t seed) : rng_(seed) {}

  // An int64 from a mix of edge values and small/large ranges.
  int64_t Value() {
    static constexpr int64_t kEdges[] = {0,
                                         1,
                                         -1,
                                         2,
                                         7,
                                         64,
                                         4096,
                                         16384,
                                         int64_t{1} << 20,
                                         (int64_t{1} << 31) - 1,
                                         int64_t{1} << 31,
                                         int64_t{1} << 40,
                                         std::numeric_limits<int64_t>::max(),
                                         std::numeric_limits<int64_t>::min()};
    switch (Pick(4)) {
      case 0:
        return kEdges[Pick(std::size(kEdges))];
      case 1:
        return static_cast<int64_t>(Pick(64));
      case 2:
        return static_cast<int64_t>(Pick(20000)) - 100;
      default:
        return static_cast<int64_t>(rng_());
    }
  }
  // Mostly valid-looking, sometimes anything.
  int64_t Small(int64_t hi) { return Pick(40) == 0 ? Value() : static_cast<int64_t>(Pick(hi + 1)); }
  // Mostly a known value (0-3 covers every enum's range), sometimes an unknown one.
  int Enum() { return Pick(30) == 0 ? static_cast<int>(Pick(20)) - 5 : static_cast<int>(Pick(4)); }
  bool Coin() { return Pick(2) == 0; }

  void FillOptions(v1::PlanOptions* o) {
    o->set_max_token_len(Pick(20) == 0 ? Value() : 1000 + static_cast<int64_t>(Pick(20000)));
    if (Coin()) o->set_cap_mode(static_cast<v1::CapMode>(Enum()));
    if (Coin()) o->set_max_seqs_per_micro_batch(Small(16));
    if (Coin()) o->set_min_micro_batches(Small(8));
    if (Coin()) o->set_divisible_by(Small(4));
    if (Coin()) o->set_align_to(Small(64));
    if (Coin()) o->set_align_total_to(Small(256));
    if (Coin()) o->set_algorithm(static_cast<v1::Algorithm>(Enum()));
    if (Coin()) o->set_cost(static_cast<v1::CostModel>(Enum()));
    if (Coin()) o->set_attention_linear(Small(30000));
    if (Coin()) o->set_attention_quadratic(Small(3));
    if (Coin()) o->set_overlong(static_cast<v1::OverlongPolicy>(Enum()));
    if (Coin()) o->set_order(static_cast<v1::PartOrder>(Enum()));
    if (Coin()) o->set_max_micro_batches(Small(512));
    if (Coin()) o->set_same_micro_num_in_dp(Coin());
  }
  void FillLoss(v1::LossOptions* l) {
    if (Coin()) l->set_mode(static_cast<v1::LossMode>(Enum()));
    if (Coin()) l->set_dp_reduction(static_cast<v1::DpReduction>(Enum()));
    if (Coin()) {
      static constexpr double kConstants[] = {0.0,
                                              -1.0,
                                              1.0,
                                              4096.0,
                                              1e300,
                                              std::numeric_limits<double>::infinity(),
                                              std::numeric_limits<double>::quiet_NaN()};
      l->set_sum_norm_constant(kConstants[Pick(std::size(kConstants))]);
    }
  }
  template <typename Field>
  void FillLengths(Field* lengths, Field* loss_tokens) {
    const size_t n = Pick(6) == 0 ? Pick(3) : Pick(300);
    for (size_t i = 0; i < n; ++i) {
      lengths->Add(Pick(400) == 0 ? Value() : 1 + static_cast<int64_t>(Pick(8000)));
    }
    if (Coin()) {
      const size_t m = Pick(20) == 0 ? Pick(n + 2) : n;
      for (size_t i = 0; i < m; ++i) {
        loss_tokens->Add(Pick(400) == 0 ? Value() : static_cast<int64_t>(Pick(100)));
      }
    }
  }

  v1::PlanRequest Plan() {
    v1::PlanRequest r;
    r.set_stream(Pick(40) == 0 ? std::string(Pick(200), 'x') : "s");
    r.set_round(Value());
    FillLengths(r.mutable_lengths(), r.mutable_loss_tokens());
    FillOptions(r.mutable_options());
    FillLoss(r.mutable_loss());
    return r;
  }
  v1::PartitionRequest Partition() {
    v1::PartitionRequest r;
    FillLengths(r.mutable_lengths(), r.mutable_loss_tokens());
    FillOptions(r.mutable_options());
    FillLoss(r.mutable_loss());
    r.set_num_micro_batches(Small(300));
    if (Coin()) {
      r.mutable_global()->set_loss_tokens(Small(1000));
      r.mutable_global()->set_sequences_with_loss(Small(100));
      r.mutable_global()->set_world_size(Small(8));
    }
    return r;
  }
  v1::BalanceBatchRequest Balance() {
    v1::BalanceBatchRequest r;
    FillLengths(r.mutable_lengths(), r.mutable_loss_tokens());
    FillOptions(r.mutable_options());
    FillLoss(r.mutable_loss());
    r.set_world_size(Small(16));
    if (Pick(4) == 0) {
      const size_t m = Pick(8) == 0 ? Pick(5) : static_cast<size_t>(r.lengths_size());
      for (size_t i = 0; i < m; ++i) r.add_group_ids(Small(20));
    }
    return r;
  }
  v1::PlanDynamicCpRequest DynamicCp() {
    v1::PlanDynamicCpRequest r;
    FillLengths(r.mutable_lengths(), r.mutable_loss_tokens());
    FillLoss(r.mutable_loss());
    r.set_world_size(Small(16));
    // Mostly a rank of the world, sometimes anything.
    const auto rank = [&] {
      return Pick(40) == 0 || r.world_size() < 1 ? Value()
                                                 : static_cast<int64_t>(Pick(r.world_size()));
    };
    v1::DynamicCpOptions* o = r.mutable_options();
    o->set_max_tokens_per_rank(Pick(20) == 0 ? Value() : 500 + static_cast<int64_t>(Pick(8000)));
    if (Coin()) o->set_sizes(static_cast<v1::CpSizeRule>(Enum()));
    if (Coin()) o->set_min_cp(Small(4));
    if (Pick(4) == 0) o->set_max_cp(Small(16));
    if (Coin()) o->set_tensor_parallel(Small(4));
    if (Coin()) o->set_divisible_by(Small(4));
    if (Coin()) o->set_linear(Small(5000));
    if (Coin()) o->set_quadratic(Small(3));
    if (Coin()) o->set_comm(Small(500));
    if (Coin()) o->set_micro_batch_cost(Small(10000));
    if (Coin()) o->set_node_ranks(Small(8));
    if (Coin()) o->set_comm_across_nodes(Small(5000));
    if (Coin()) {
      const size_t m = Pick(20) == 0 ? Pick(r.lengths_size() + 2) : r.lengths_size();
      for (size_t i = 0; i < m; ++i) r.add_owner_ranks(rank());
    }
    if (Coin()) r.set_rank(rank());
    return r;
  }
  // A forest: mostly valid (parents before children, every leaf a rollout), sometimes a bad
  // parent, length, leaf or declared length; loss tokens per rollout.
  template <typename Request>
  void FillForest(Request* r) {
    v1::Forest* f = r->mutable_forest();
    const int64_t n =
        Pick(8) == 0 ? static_cast<int64_t>(Pick(3)) : 1 + static_cast<int64_t>(Pick(120));
    for (int64_t i = 0; i < n; ++i) {
      f->add_node_len(Pick(300) == 0 ? Value() : 1 + static_cast<int64_t>(Pick(3000)));
      const int64_t parent = i == 0 || Pick(4) == 0 ? -1 : static_cast<int64_t>(Pick(i));
      f->add_node_parent(Pick(300) == 0 ? Value() : parent);
    }
    std::vector<bool> inner(n, false);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t parent = f->node_parent(i);
      if (parent >= 0 && parent < n) inner[parent] = true;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!inner[i] || Pick(5) == 0) f->add_rollout_leaf(Pick(300) == 0 ? Value() : i);
    }
    if (Pick(10) == 0) {
      for (int i = 0; i < f->rollout_leaf_size(); ++i) f->add_rollout_len(Small(10000));
    }
    if (Coin()) {
      for (int i = 0; i < f->rollout_leaf_size(); ++i) r->add_loss_tokens(Small(50));
    }
    if (Pick(30) == 0) r->add_lengths(5);  // both lengths and a forest
  }
  std::string Bytes() {
    std::string bytes(Pick(200), '\0');
    for (char& c : bytes) c = static_cast<char>(Pick(256));
    return bytes;
  }

 private:
  size_t Pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  std::mt19937_64 rng_;
};

bool Expected(const absl::Status& status) {
  return status.ok() || absl::IsInvalidArgument(status) || absl::IsResourceExhausted(status);
}

ServiceLimits FuzzLimits() {
  ServiceLimits limits;
  limits.max_sequences_per_request = 256;
  limits.max_micro_batches = 512;
  return limits;
}

TEST(ValidationFuzz, PlanRequestsAreAcceptedOrRejectedCleanly) {
  RandomRequests random(20261123 + testing::SoakSeed());
  const ServiceLimits limits = FuzzLimits();
  int accepted = 0;
  int planned = 0;
  for (int64_t i = 0; i < testing::SoakTrials(5000); ++i) {
    const v1::PlanRequest request = random.Plan();
    const absl::StatusOr<RoundInput> round = ToRoundInput(request, limits);
    ASSERT_TRUE(Expected(round.status())) << round.status() << "\n" << request.DebugString();
    const absl::StatusOr<PlanInput> input = ToPlanInput(request, limits);
    ASSERT_TRUE(Expected(input.status())) << input.status();
    if (!input.ok()) continue;
    ++accepted;
    // What validation accepted, the planner plans or rejects as bad input.
    const absl::StatusOr<planner::Problem> problem =
        planner::Problem::Create(input->lengths, input->options);
    ASSERT_TRUE(problem.ok() || absl::IsInvalidArgument(problem.status())) << problem.status();
    if (!problem.ok()) continue;
    const absl::StatusOr<planner::MicroBatchPlan> plan = problem->Partition(problem->local_k());
    ASSERT_TRUE(plan.ok()) << plan.status();
    ++planned;
    if (input->loss_tokens) {
      const absl::StatusOr<planner::LossCounts> counts =
          planner::CountLoss(*plan, *input->loss_tokens);
      ASSERT_TRUE(counts.ok()) << counts.status();
      ASSERT_TRUE(
          planner::ComputeLossWeights(*plan, *input->loss_tokens, input->loss, *counts, 1).ok());
    }
  }
  // The driver reaches the planner often enough to mean something.
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(planned, 500);
}

TEST(ValidationFuzz, ForestRequestsAreAcceptedOrRejectedCleanly) {
  RandomRequests random(31 + testing::SoakSeed());
  const ServiceLimits limits = FuzzLimits();
  int planned = 0;
  for (int64_t i = 0; i < testing::SoakTrials(1500); ++i) {
    v1::PlanRequest request;
    request.set_stream("s");
    random.FillForest(&request);
    random.FillOptions(request.mutable_options());
    random.FillLoss(request.mutable_loss());
    ASSERT_TRUE(Expected(ToRoundInput(request, limits).status()));
    const absl::StatusOr<PlanInput> input = ToPlanInput(request, limits);
    ASSERT_TRUE(Expected(input.status())) << input.status();
    if (!input.ok()) continue;
    ASSERT_TRUE(input->forest.has_value());
    const absl::StatusOr<planner::TreeProblem> problem =
        planner::TreeProblem::Create(*input->forest, input->options);
    ASSERT_TRUE(problem.ok() || absl::IsInvalidArgument(problem.status())) << problem.status();
    if (!problem.ok()) continue;
    ASSERT_TRUE(problem->Partition(problem->local_k()).ok());
    ++planned;

    v1::PartitionRequest partition;
    random.FillForest(&partition);
    random.FillOptions(partition.mutable_options());
    partition.set_num_micro_batches(random.Small(40));
    v1::PlanResponse response;
    ASSERT_TRUE(Expected(RunPartition(partition, limits, &response)));
    v1::BalanceBatchRequest balance;
    random.FillForest(&balance);
    random.FillOptions(balance.mutable_options());
    balance.set_world_size(random.Small(8));
    v1::BalanceBatchResponse balanced;
    ASSERT_TRUE(Expected(RunBalanceBatch(balance, limits, /*stop=*/{}, &balanced)));
  }
  EXPECT_GT(planned, 200);
}

TEST(ValidationFuzz, PartitionAndBalanceBatchRequests) {
  RandomRequests random(7 + testing::SoakSeed());
  const ServiceLimits limits = FuzzLimits();
  int ok = 0;
  for (int64_t i = 0; i < testing::SoakTrials(1500); ++i) {
    v1::PlanResponse plan;
    const absl::Status partition = RunPartition(random.Partition(), limits, &plan);
    ASSERT_TRUE(Expected(partition)) << partition;
    v1::BalanceBatchResponse balanced;
    const absl::Status balance = RunBalanceBatch(random.Balance(), limits, /*stop=*/{}, &balanced);
    ASSERT_TRUE(Expected(balance)) << balance;
    ok += partition.ok() + balance.ok();
  }
  EXPECT_GT(ok, 300);
}

TEST(ValidationFuzz, PlanDynamicCpRequests) {
  RandomRequests random(11 + testing::SoakSeed());
  const ServiceLimits limits = FuzzLimits();
  int ok = 0;
  for (int64_t i = 0; i < testing::SoakTrials(1500); ++i) {
    const v1::PlanDynamicCpRequest request = random.DynamicCp();
    EXPECT_GE(EstimateDynamicCpMemory(request, limits).bytes, kPeakBase);
    int64_t reserved = -1;
    v1::PlanDynamicCpResponse response;
    const absl::Status status = RunPlanDynamicCp(
        request, limits, /*stop=*/{},
        [&](int64_t bytes) {
          reserved = bytes;
          return absl::OkStatus();
        },
        &response);
    ASSERT_TRUE(Expected(status)) << status;
    // With a stream, the request's own error (checked before planning) joins the agreement
    // round: the error RunPlanDynamicCp returns. The round compares the step's fingerprint.
    v1::PlanDynamicCpRequest streamed = request;
    streamed.set_stream(absl::StrCat("step-", i % 3));
    streamed.set_round(i);
    const absl::StatusOr<RoundInput> round = ToDynamicCpRound(streamed, limits);
    ASSERT_TRUE(round.ok()) << round.status();
    EXPECT_TRUE(round->agree_only);
    EXPECT_EQ(round->stream, streamed.stream());
    EXPECT_EQ(round->round, i);
    EXPECT_EQ(round->options_hash, StepFingerprint(request));
    if (!round->error.ok()) {
      EXPECT_EQ(round->error, status);
    }
    if (!status.ok()) continue;
    ++ok;
    // Every view asked for, one slot each per slot of the plan, reserved before it was written.
    const int64_t views = request.has_rank() ? 1 : request.world_size();
    ASSERT_EQ(response.ranks_size(), views);
    for (const v1::CpRankView& view : response.ranks()) {
      ASSERT_EQ(view.slots_size(), response.num_micro_batches());
    }
    EXPECT_GE(reserved, kPeakPerCpView * views * response.num_micro_batches());
  }
  EXPECT_GT(ok, 200);
}

// Small steps with adversarial options — up to 2^20 ranks in small groups, divisible_by up to
// the ceiling — through admission as the sidecar runs it: a request whose estimate is within the
// budget plans (or fails cleanly) with the planner held to the groups reserved; the rest are
// refused before planning. None takes long: the planner's groups stay within what was reserved.
TEST(ValidationFuzz, AdversarialDynamicCpStepsAreBoundedByTheirEstimate) {
  std::mt19937_64 rng(29 + testing::SoakSeed());
  ServiceLimits limits = FuzzLimits();
  limits.max_micro_batches = 1 << 20;
  constexpr int64_t kBudget = int64_t{64} << 20;
  int planned = 0;
  int refused = 0;
  for (int64_t i = 0; i < testing::SoakTrials(120); ++i) {
    v1::PlanDynamicCpRequest request;
    const int log_r = std::uniform_int_distribution<int>(0, 20)(rng);
    request.set_world_size(int64_t{1} << log_r);
    const int n = std::uniform_int_distribution<int>(0, 3)(rng);
    for (int s = 0; s < n; ++s) {
      request.add_lengths(std::uniform_int_distribution<int64_t>(1, 1 << 16)(rng));
    }
    v1::DynamicCpOptions* o = request.mutable_options();
    o->set_max_tokens_per_rank(1 << 10);
    o->set_max_cp(int64_t{1} << std::uniform_int_distribution<int>(0, log_r)(rng));
    o->set_divisible_by(int64_t{1} << std::uniform_int_distribution<int>(0, 20)(rng));
    request.set_rank(0);
    const int64_t estimate = EstimateDynamicCpMemory(request, limits).bytes;
    if (estimate > kBudget) {
      ++refused;
      continue;
    }
    v1::PlanDynamicCpResponse response;
    const absl::Status status = RunPlanDynamicCp(
        request, limits, /*stop=*/{},
        [&](int64_t bytes) {
          return estimate + bytes > kBudget ? absl::ResourceExhaustedError("over the budget")
                                            : absl::OkStatus();
        },
        &response);
    ASSERT_TRUE(Expected(status)) << status;
    planned += status.ok();
  }
  EXPECT_GT(planned, 10);
  EXPECT_GT(refused, 10);
}

TEST(ValidationFuzz, TheStepFingerprintCoversEveryFieldButTheCallersOwn) {
  RandomRequests random(23 + testing::SoakSeed());
  for (int64_t i = 0; i < testing::SoakTrials(300); ++i) {
    v1::PlanDynamicCpRequest request = random.DynamicCp();
    request.mutable_model_config()->mutable_ints()->insert({"hidden_size", 1 + i});
    request.mutable_model_config()->mutable_strings()->insert({"model_type", "llama"});
    const uint64_t base = StepFingerprint(request);
    // The caller's own fields: its view, its stream and round.
    v1::PlanDynamicCpRequest same = request;
    same.set_rank(same.rank() + 1);
    same.set_stream("other");
    same.set_round(i + 7);
    EXPECT_EQ(StepFingerprint(same), base);
    // The same map entries inserted in another order.
    v1::ModelConfig reordered;
    reordered.mutable_strings()->insert({"model_type", "llama"});
    reordered.mutable_ints()->insert({"num_layers", 2});
    reordered.mutable_ints()->insert({"hidden_size", 1 + i});
    v1::ModelConfig ordered = request.model_config();
    ordered.mutable_ints()->insert({"num_layers", 2});
    v1::PlanDynamicCpRequest a = request;
    v1::PlanDynamicCpRequest b = request;
    *a.mutable_model_config() = ordered;
    *b.mutable_model_config() = reordered;
    EXPECT_EQ(StepFingerprint(a), StepFingerprint(b));
    EXPECT_NE(StepFingerprint(a), base);
    // Any one field of the step changed.
    std::vector<v1::PlanDynamicCpRequest> changed(7, request);
    changed[0].set_world_size(request.world_size() + 1);
    if (request.lengths_size() > 0) {
      changed[1].set_lengths(0, request.lengths(0) + 1);
    } else {
      changed[1].add_lengths(1);
    }
    changed[2].add_owner_ranks(0);
    changed[3].add_loss_tokens(0);
    changed[4].mutable_options()->set_comm(request.options().comm() + 1);
    changed[5].mutable_loss()->set_mode(
        static_cast<v1::LossMode>((static_cast<int>(request.loss().mode()) + 1) % 6));
    changed[6].clear_model_config();
    for (size_t c = 0; c < changed.size(); ++c) {
      EXPECT_NE(StepFingerprint(changed[c]), base) << "change " << c;
    }
  }
}

TEST(ValidationFuzz, RandomWireBytes) {
  RandomRequests random(99 + testing::SoakSeed());
  const ServiceLimits limits = FuzzLimits();
  // Random bytes often hold invalid UTF-8 in string fields: protobuf rejects them (tested below
  // as a failed parse) and would log each one.
  const google::protobuf::LogSilencer quiet;
  for (int64_t i = 0; i < testing::SoakTrials(3000); ++i) {
    v1::PlanRequest request;
    if (!request.ParseFromString(random.Bytes())) continue;
    ASSERT_TRUE(Expected(ToRoundInput(request, limits).status()));
    ASSERT_TRUE(Expected(ToPlanInput(request, limits).status()));
  }
}

}  // namespace
}  // namespace packsched::service
