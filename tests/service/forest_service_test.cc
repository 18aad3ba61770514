// Tree packing through the sidecar's core: a forest request converted and validated (errors
// name the node or rollout, limits are RESOURCE_EXHAUSTED), Partition and BalanceBatch over a
// forest (model_config costing the forest), the memory estimate, and rounds in which ranks
// planning forests agree on k.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/group/collective_agreement.h"
#include "server/planner/model_cost.h"
#include "server/planner/tree_plan.h"
#include "server/service/balance_batch.h"
#include "server/service/convert.h"
#include "server/service/coordinator.h"
#include "server/service/partition.h"
#include "server/service/request_memory.h"
#include "tests/collective/in_process_collective.h"
#include "tests/service/service_test_util.h"

namespace packsched::service {
namespace {

using ::packsched::service::testing::Call;
using ::packsched::service::testing::Input;
using ::packsched::service::testing::OfOne;
using ::packsched::service::testing::Result;
using ::packsched::service::testing::SubmitAndWait;
using ::testing::HasSubstr;

// GRPO-shaped: per group a prompt and `n` completions.
void AddGroups(v1::Forest* f, const std::vector<int64_t>& prompts, int64_t n, int64_t completion) {
  for (int64_t prompt : prompts) {
    const int64_t root = f->node_len_size();
    f->add_node_len(prompt);
    f->add_node_parent(-1);
    for (int64_t c = 0; c < n; ++c) {
      f->add_node_len(completion + c);
      f->add_node_parent(root);
      f->add_rollout_leaf(f->node_len_size() - 1);
    }
  }
}

v1::PlanRequest ForestRequest(const std::string& stream, int64_t round,
                              const std::vector<int64_t>& prompts, int64_t cap) {
  v1::PlanRequest request;
  request.set_stream(stream);
  request.set_round(round);
  request.mutable_options()->set_max_token_len(cap);
  AddGroups(request.mutable_forest(), prompts, 4, 50);
  return request;
}

absl::Status Error(const v1::PlanRequest& request, const ServiceLimits& limits = {}) {
  return ToPlanInput(request, limits).status();
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(ForestRequest, ConvertsAndNamesBadInput) {
  v1::PlanRequest ok = ForestRequest("s", 1, {100, 200}, 1024);
  const absl::StatusOr<PlanInput> input = ToPlanInput(ok, {});
  ASSERT_TRUE(input.ok()) << input.status();
  ASSERT_TRUE(input->forest.has_value());
  EXPECT_TRUE(input->lengths.empty());

  v1::PlanRequest both = ok;
  both.add_lengths(5);
  EXPECT_THAT(Message(Error(both)), HasSubstr("lengths and forest are both set"));

  v1::PlanRequest bad_parent = ok;
  bad_parent.mutable_forest()->set_node_parent(2, 7);
  EXPECT_EQ(Error(bad_parent).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(Error(bad_parent)), HasSubstr("node 2 has node_parent = 7"));

  v1::PlanRequest zero = ok;
  zero.mutable_forest()->set_node_len(1, 0);
  EXPECT_THAT(Message(Error(zero)), HasSubstr("node 1 has node_len = 0"));

  v1::PlanRequest declared = ok;
  for (int r = 0; r < declared.forest().rollout_leaf_size(); ++r) {
    declared.mutable_forest()->add_rollout_len(r == 3 ? 1 : 150 + r);
  }
  EXPECT_THAT(Message(Error(declared)), HasSubstr("rollout 3 declares rollout_len = 1"));

  v1::PlanRequest loss = ok;
  for (int r = 0; r < loss.forest().rollout_leaf_size(); ++r)
    loss.add_loss_tokens(r == 1 ? 999 : 5);
  EXPECT_THAT(Message(Error(loss)), HasSubstr("loss_tokens[1] = 999"));

  ServiceLimits small;
  small.max_sequences_per_request = 5;
  EXPECT_EQ(Error(ok, small).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(Error(ok, small)), HasSubstr("--max_sequences_per_request"));

  // With context parallelism every piece is aligned to 2 * cp (its CP shards), over the wire too.
  v1::PlanRequest cp = ok;
  cp.mutable_options()->set_context_parallel(2);
  RoundCoordinator coordinator(OfOne());
  const Result sharded = SubmitAndWait(coordinator, Input(cp));
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  v1::PlanResponse response;
  RoundResultToProto(**sharded, &response);
  ASSERT_GT(response.micro_batches_size(), 0);
  for (const v1::MicroBatch& mb : response.micro_batches()) {
    for (int b = 0; b + 1 < mb.cu_seqlens_aligned_size(); ++b) {
      EXPECT_EQ((mb.cu_seqlens_aligned(b + 1) - mb.cu_seqlens_aligned(b)) % 4, 0) << "piece " << b;
    }
  }
}

TEST(ForestRequest, MemoryEstimateCountsNodesAndRollouts) {
  const v1::PlanRequest request = ForestRequest("s", 1, {100, 200, 300}, 1024);
  const RequestMemory memory = EstimatePlanMemory(request, {});
  EXPECT_EQ(memory.sequences, 15 + 12);
  EXPECT_GE(memory.micro_batches, 1);
  EXPECT_LE(memory.micro_batches, 12);
}

// A trunk of one-token nodes with a rollout at every node: under a cap of 10 tokens the tree is
// split, rollouts 0..9 fit the room and add their paths (1 + 2 + ... + 10 nodes) to the split
// occurrences, the deeper ones, isolated, add theirs (11 + ... + 30) to the isolated ones; with
// drop they add none, and a cap the whole trunk fits adds nothing at all.
TEST(ForestRequest, MemoryEstimateCountsTheNodesPiecesRepeat) {
  v1::PlanRequest request;
  request.set_stream("s");
  request.set_round(1);
  for (int i = 0; i < 30; ++i) {
    request.mutable_forest()->add_node_len(1);
    request.mutable_forest()->add_node_parent(i - 1);
    request.mutable_forest()->add_rollout_leaf(i);
  }
  request.mutable_options()->set_max_token_len(10);
  request.mutable_options()->set_overlong(v1::OVERLONG_POLICY_ISOLATE);
  const RequestMemory isolate = EstimatePlanMemory(request, {});
  EXPECT_EQ(isolate.split_entries, 55);
  EXPECT_EQ(isolate.isolated_entries, 465 - 55);
  EXPECT_EQ(isolate.bytes, PeakBytes(60, 30, static_cast<int64_t>(request.ByteSizeLong()), 0) +
                               kPeakPerTreeMicroBatch * 30 + kPeakPerSplitEntry * 55 +
                               kPeakPerIsolatedEntry * (465 - 55));
  request.mutable_options()->set_overlong(v1::OVERLONG_POLICY_DROP);
  EXPECT_EQ(EstimatePlanMemory(request, {}).isolated_entries, 0);
  request.mutable_options()->set_max_token_len(30);
  const RequestMemory whole = EstimatePlanMemory(request, {});
  EXPECT_EQ(whole.split_entries + whole.isolated_entries, 0);
  // Partition and BalanceBatch count them as Plan does.
  v1::PartitionRequest partition;
  *partition.mutable_forest() = request.forest();
  partition.set_num_micro_batches(30);
  partition.mutable_options()->set_max_token_len(10);
  partition.mutable_options()->set_overlong(v1::OVERLONG_POLICY_ISOLATE);
  EXPECT_EQ(EstimatePartitionMemory(partition, {}).isolated_entries, 465 - 55);
  v1::BalanceBatchRequest balance;
  *balance.mutable_forest() = request.forest();
  balance.set_world_size(2);
  *balance.mutable_options() = partition.options();
  EXPECT_EQ(EstimateBalanceBatchMemory(balance, {}).split_entries, 55);
  // With group_ids every rollout's path counts, a tree that fits the cap included: a rollout a
  // group on this chain copies every node on each path (1 + 2 + ... + 30 copies).
  balance.mutable_options()->set_max_token_len(30);
  EXPECT_EQ(EstimateBalanceBatchMemory(balance, {}).split_entries, 0);
  for (int r = 0; r < 30; ++r) balance.add_group_ids(r);
  EXPECT_EQ(EstimateBalanceBatchMemory(balance, {}).split_entries, 465);
  // A forest that validation refuses (a parent after its child) counts none.
  request.mutable_forest()->set_node_parent(3, 7);
  request.mutable_options()->set_max_token_len(10);
  EXPECT_EQ(EstimatePlanMemory(request, {}).split_entries, 0);
}

TEST(ForestRound, PlansAndAnswersWithTheLayout) {
  RoundCoordinator coordinator(OfOne());
  v1::PlanRequest request = ForestRequest("s", 3, {300, 500, 200}, 1000);
  for (int r = 0; r < request.forest().rollout_leaf_size(); ++r) request.add_loss_tokens(10);
  const Result result = SubmitAndWait(coordinator, Input(request));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE((*result)->tree.has_value());
  v1::PlanResponse response;
  RoundResultToProto(**result, &response);
  EXPECT_EQ(response.tree().layouts_size(), response.micro_batches_size());
  EXPECT_EQ(response.revert_size(), 12);        // over rollouts
  EXPECT_EQ(response.loss_weights_size(), 12);  // per rollout
  EXPECT_DOUBLE_EQ(response.loss_weights(0), 1.0 / 120);
  EXPECT_EQ(response.global().num_sequences(), 12);
  // Each prompt once: 300 + 500 + 200 + 3 x (50 + 51 + 52 + 53).
  EXPECT_EQ(response.tree().forwarded_tokens(), 1000 + 3 * 206);
  int64_t held = 0;
  for (const v1::TreeLayout& layout : response.tree().layouts()) held += layout.rollouts_size();
  EXPECT_EQ(held, 12);
}

TEST(ForestPartitionAndBalance, AnswerOverPiecesAndRollouts) {
  v1::PartitionRequest partition;
  partition.mutable_options()->set_max_token_len(700);
  AddGroups(partition.mutable_forest(), {300, 500, 200}, 4, 50);
  partition.set_num_micro_batches(4);
  v1::PlanResponse answer;
  ASSERT_TRUE(RunPartition(partition, {}, &answer).ok());
  EXPECT_EQ(answer.micro_batches_size(), 4);
  EXPECT_EQ(answer.tree().layouts_size(), 4);
  EXPECT_EQ(answer.reorder_size(), 12);

  v1::BalanceBatchRequest balance;
  balance.mutable_options()->set_max_token_len(700);
  AddGroups(balance.mutable_forest(), {300, 500, 200, 100, 400}, 4, 50);
  balance.set_world_size(2);
  for (int r = 0; r < 20; ++r) balance.add_loss_tokens(r);
  v1::BalanceBatchResponse batch;
  const absl::Status status = RunBalanceBatch(balance, {}, /*stop=*/{}, &batch);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(batch.ranks_size(), 2);
  std::vector<int> seen(20, 0);
  for (const v1::RankPlan& rank : batch.ranks()) {
    EXPECT_EQ(rank.plan().micro_batches_size(), batch.num_micro_batches());
    EXPECT_EQ(rank.plan().tree().layouts_size(), batch.num_micro_batches());
    for (int64_t r : rank.indices()) ++seen[r];
    EXPECT_EQ(rank.plan().loss_weights_size(), 20);
  }
  for (int s : seen) EXPECT_EQ(s, 1);
  EXPECT_EQ(batch.global().loss_tokens(), 190);

  // group_ids, one per rollout: a group's rollouts on one rank (groups across the trees).
  for (int r = 0; r < 20; ++r) balance.add_group_ids(r % 3 == 0 ? 7 : r % 2);
  const absl::Status grouped = RunBalanceBatch(balance, {}, /*stop=*/{}, &batch);
  ASSERT_TRUE(grouped.ok()) << grouped;
  std::vector<int> rank_of(20, -1);
  for (int rank = 0; rank < batch.ranks_size(); ++rank) {
    for (int64_t r : batch.ranks(rank).indices()) rank_of[r] = rank;
  }
  for (int r = 0; r < 20; ++r) {
    for (int q = 0; q < r; ++q) {
      if (balance.group_ids(q) == balance.group_ids(r)) {
        EXPECT_EQ(rank_of[q], rank_of[r]) << "rollouts " << q << " and " << r;
      }
    }
  }
  EXPECT_EQ(batch.global().loss_tokens(), 190);
  balance.add_group_ids(1);
  EXPECT_THAT(std::string(RunBalanceBatch(balance, {}, /*stop=*/{}, &batch).message()),
              HasSubstr("group_ids has 21 entries for 20 rollouts"));
}

void AddLlama7b(v1::ModelConfig* model) {
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"hidden_size", 4096},
                                   {"num_hidden_layers", 32},
                                   {"num_attention_heads", 32},
                                   {"intermediate_size", 11008},
                                   {"vocab_size", 32000}}) {
    (*model->mutable_ints())[key] = value;
  }
  (*model->mutable_strings())["model_type"] = "llama";
}

// model_config over a forest: the plan of the attention cost with the weights the model gives
// the forest (planner::UseModelCost), and a forest of chains planned as its lengths.
TEST(ForestBalance, ModelConfigCostsTheForest) {
  v1::BalanceBatchRequest request;
  request.mutable_options()->set_max_token_len(4096);
  request.mutable_options()->set_align_to(8);
  AddGroups(request.mutable_forest(), {900, 1500, 300, 2000, 700, 1200}, 6, 150);
  request.set_world_size(3);
  request.set_sync(v1::SYNC_MICRO_BATCH);
  request.set_micro_batch_cost(5);  // the model's replaces it
  AddLlama7b(request.mutable_model_config());
  v1::BalanceBatchResponse modelled;
  const absl::Status status = RunBalanceBatch(request, {}, /*stop=*/{}, &modelled);
  ASSERT_TRUE(status.ok()) << status;

  const absl::StatusOr<PlanInput> input =
      MakePlanInput(request.lengths(), request.options(), request.loss_tokens(), request.loss(), {},
                    /*planner_picks_k=*/true, &request.forest());
  ASSERT_TRUE(input.ok()) << input.status();
  planner::PlanOptions weights = input->options;
  const absl::flat_hash_map<std::string, int64_t> ints(request.model_config().ints().begin(),
                                                       request.model_config().ints().end());
  const absl::flat_hash_map<std::string, std::string> strings(
      request.model_config().strings().begin(), request.model_config().strings().end());
  const absl::StatusOr<int64_t> micro_batch_cost =
      planner::UseModelCost(ints, strings, *input->forest, weights);
  ASSERT_TRUE(micro_batch_cost.ok()) << micro_batch_cost.status();
  v1::BalanceBatchRequest by_hand = request;
  by_hand.clear_model_config();
  by_hand.mutable_options()->set_cost(v1::COST_MODEL_ATTENTION);
  by_hand.mutable_options()->set_attention_linear(weights.attention.linear);
  by_hand.mutable_options()->set_attention_quadratic(weights.attention.quadratic);
  by_hand.set_micro_batch_cost(*micro_batch_cost);
  v1::BalanceBatchResponse want;
  ASSERT_TRUE(RunBalanceBatch(by_hand, {}, /*stop=*/{}, &want).ok());
  EXPECT_EQ(modelled.SerializeAsString(), want.SerializeAsString());
  EXPECT_GT(modelled.step().micro_batch_sync_cost(), 0);
  for (const v1::RankPlan& rank : modelled.ranks()) {
    for (const v1::MicroBatch& part : rank.plan().micro_batches()) {
      EXPECT_LE(part.aligned_tokens(), 4096);
    }
  }

  // Chains: the forest's answer is the lengths' answer (rollout r is sequence r).
  v1::BalanceBatchRequest lengths = request;
  lengths.clear_forest();
  v1::BalanceBatchRequest chains = lengths;
  for (int64_t len : {700, 1800, 90, 2500, 1300, 40, 3000, 610, 950, 1111, 77, 2048}) {
    lengths.add_lengths(len);
    chains.mutable_forest()->add_node_len(len);
    chains.mutable_forest()->add_node_parent(-1);
    chains.mutable_forest()->add_rollout_leaf(chains.forest().node_len_size() - 1);
  }
  v1::BalanceBatchResponse flat, tree;
  ASSERT_TRUE(RunBalanceBatch(lengths, {}, /*stop=*/{}, &flat).ok());
  ASSERT_TRUE(RunBalanceBatch(chains, {}, /*stop=*/{}, &tree).ok());
  EXPECT_EQ(tree.num_micro_batches(), flat.num_micro_batches());
  EXPECT_EQ(tree.step().micro_batch_sync_cost(), flat.step().micro_batch_sync_cost());
  ASSERT_EQ(tree.ranks_size(), flat.ranks_size());
  for (int r = 0; r < flat.ranks_size(); ++r) {
    EXPECT_EQ(tree.ranks(r).cost(), flat.ranks(r).cost());
    EXPECT_THAT(tree.ranks(r).indices(), ::testing::ElementsAreArray(flat.ranks(r).indices()));
  }

  // group_ids of the wrong size with a forest: the message names them alone.
  request.add_group_ids(0);
  const std::string refused(RunBalanceBatch(request, {}, /*stop=*/{}, &modelled).message());
  EXPECT_THAT(refused, HasSubstr("group_ids has 1 entries for"));
  EXPECT_THAT(refused, ::testing::Not(HasSubstr("model_config")));
}

// Two sidecar cores agreeing over an in-process group, each planning its own forest: both
// answer with the larger local bound.
TEST(ForestRound, RanksAgreeOnK) {
  auto group = collective::CreateInProcessGroup(2);
  std::vector<std::unique_ptr<RoundCoordinator>> ranks;
  for (auto& rank : group) {
    auto holder = std::make_shared<std::unique_ptr<collective::Collective>>(std::move(rank));
    RoundCoordinator::Options options;
    options.agreements = std::make_shared<group::CollectiveAgreements>(
        absl::Seconds(20), [holder](absl::string_view) {
          return absl::StatusOr<std::unique_ptr<collective::Collective>>(std::move(*holder));
        });
    ranks.push_back(std::make_unique<RoundCoordinator>(std::move(options)));
  }
  Call big(*ranks[0], Input(ForestRequest("s", 1, {600, 600, 600, 600, 600}, 1000)));
  Call small(*ranks[1], Input(ForestRequest("s", 1, {100}, 1000)));
  const Result& r0 = big.Wait();
  const Result& r1 = small.Wait();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_GT((*r0)->local_k, (*r1)->local_k);
  EXPECT_EQ((*r0)->num_micro_batches, (*r0)->local_k);
  EXPECT_EQ((*r1)->num_micro_batches, (*r0)->local_k);
  EXPECT_EQ(static_cast<int64_t>((*r1)->tree->parts.size()), (*r0)->local_k);
  EXPECT_EQ((*r0)->global.num_sequences, 24);
}

}  // namespace
}  // namespace packsched::service
