// Request validation: every class of bad input is InvalidArgument (or ResourceExhausted for a
// server limit) naming the field and the value; zero / UNSPECIFIED mean the documented defaults.

#include "server/service/convert.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "server/service/balance_batch.h"
#include "server/service/partition.h"

namespace packsched::service {
namespace {

using ::testing::HasSubstr;

v1::PlanRequest Valid() {
  v1::PlanRequest r;
  r.set_stream("actor_update");
  r.set_round(1);
  for (int64_t length : {100, 2000, 350, 7}) r.add_lengths(length);
  r.mutable_options()->set_max_token_len(4096);
  return r;
}

struct BadCase {
  std::string name;
  std::function<void(v1::PlanRequest&)> mutate;
  absl::StatusCode code;
  std::string mentions;  // field and value
};

class BadPlanRequest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadPlanRequest, IsRejectedNamingFieldAndValue) {
  ServiceLimits limits;
  limits.max_sequences_per_request = 8;
  limits.max_micro_batches = 1000;
  v1::PlanRequest request = Valid();
  GetParam().mutate(request);
  const absl::StatusOr<PlanInput> input = ToPlanInput(request, limits);
  ASSERT_FALSE(input.ok());
  EXPECT_EQ(input.status().code(), GetParam().code) << input.status();
  EXPECT_THAT(std::string(input.status().message()), HasSubstr(GetParam().mentions));
}

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kExhausted = absl::StatusCode::kResourceExhausted;
constexpr int64_t kHuge = int64_t{1} << 60;

INSTANTIATE_TEST_SUITE_P(
    Validation, BadPlanRequest,
    ::testing::Values(
        BadCase{"EmptyLengths", [](auto& r) { r.clear_lengths(); }, kInvalid, "lengths is empty"},
        BadCase{"ZeroLength", [](auto& r) { r.set_lengths(1, 0); }, kInvalid, "lengths[1] = 0"},
        BadCase{"NegativeLength", [](auto& r) { r.set_lengths(3, -9); }, kInvalid,
                "lengths[3] = -9"},
        BadCase{"HugeLength", [](auto& r) { r.set_lengths(0, kHuge); }, kInvalid,
                "lengths[0] = 1152921504606846976"},
        BadCase{"TooManySequences",
                [](auto& r) {
                  for (int i = 0; i < 5; ++i) r.add_lengths(10);
                },
                kExhausted, "9 sequences exceed the server limit --max_sequences_per_request = 8"},
        BadCase{"ZeroCap", [](auto& r) { r.mutable_options()->set_max_token_len(0); }, kInvalid,
                "options.max_token_len = 0"},
        BadCase{"NegativeCap", [](auto& r) { r.mutable_options()->set_max_token_len(-5); },
                kInvalid, "options.max_token_len = -5"},
        BadCase{"UnknownCapMode",
                [](auto& r) { r.mutable_options()->set_cap_mode(static_cast<v1::CapMode>(7)); },
                kInvalid, "options.cap_mode = 7 is not a known CapMode value"},
        BadCase{"UnknownAlgorithm",
                [](auto& r) { r.mutable_options()->set_algorithm(static_cast<v1::Algorithm>(-3)); },
                kInvalid, "options.algorithm = -3"},
        BadCase{"UnknownCost",
                [](auto& r) { r.mutable_options()->set_cost(static_cast<v1::CostModel>(9)); },
                kInvalid, "options.cost = 9"},
        BadCase{
            "UnknownOverlong",
            [](auto& r) { r.mutable_options()->set_overlong(static_cast<v1::OverlongPolicy>(4)); },
            kInvalid, "options.overlong = 4"},
        BadCase{"UnknownOrder",
                [](auto& r) { r.mutable_options()->set_order(static_cast<v1::PartOrder>(44)); },
                kInvalid, "options.order = 44"},
        BadCase{"UnknownLossMode",
                [](auto& r) { r.mutable_loss()->set_mode(static_cast<v1::LossMode>(6)); }, kInvalid,
                "loss.mode = 6"},
        BadCase{
            "UnknownDpReduction",
            [](auto& r) { r.mutable_loss()->set_dp_reduction(static_cast<v1::DpReduction>(3)); },
            kInvalid, "loss.dp_reduction = 3"},
        BadCase{"NegativeMaxSeqs",
                [](auto& r) { r.mutable_options()->set_max_seqs_per_micro_batch(-1); }, kInvalid,
                "options.max_seqs_per_micro_batch = -1"},
        BadCase{"NegativeMinMicroBatches",
                [](auto& r) { r.mutable_options()->set_min_micro_batches(-2); }, kInvalid,
                "options.min_micro_batches = -2"},
        BadCase{"HugeMinMicroBatches",
                [](auto& r) { r.mutable_options()->set_min_micro_batches(kHuge); }, kInvalid,
                "options.min_micro_batches = 1152921504606846976: must be at most "
                "max_micro_batches = 1000"},
        BadCase{"HugeDivisibleBy", [](auto& r) { r.mutable_options()->set_divisible_by(kHuge); },
                kInvalid, "options.divisible_by = 1152921504606846976"},
        BadCase{"NegativeDivisibleBy", [](auto& r) { r.mutable_options()->set_divisible_by(-4); },
                kInvalid, "options.divisible_by = -4"},
        BadCase{"MaxMicroBatchesOverTheServerLimit",
                [](auto& r) { r.mutable_options()->set_max_micro_batches(1001); }, kExhausted,
                "options.max_micro_batches = 1001 exceeds the server limit --max_micro_batches"},
        BadCase{"NegativeMaxMicroBatches",
                [](auto& r) { r.mutable_options()->set_max_micro_batches(-1); }, kInvalid,
                "options.max_micro_batches = -1"},
        BadCase{"HugeAlignTo",
                [](auto& r) { r.mutable_options()->set_align_to((int64_t{1} << 20) + 1); },
                kInvalid, "options.align_to = 1048577"},
        BadCase{"NegativeAlignTotalTo",
                [](auto& r) { r.mutable_options()->set_align_total_to(-8); }, kInvalid,
                "options.align_total_to = -8"},
        BadCase{"NegativeAttentionWeight",
                [](auto& r) { r.mutable_options()->set_attention_quadratic(-1); }, kInvalid,
                "options.attention_quadratic = -1"},
        BadCase{"HugeAttentionWeight",
                [](auto& r) { r.mutable_options()->set_attention_linear(kHuge); }, kInvalid,
                "options.attention_linear = 1152921504606846976"},
        BadCase{"LossTokensOfTheWrongSize", [](auto& r) { r.add_loss_tokens(3); }, kInvalid,
                "loss_tokens has 1 entries for 4 sequences"},
        BadCase{"NegativeLossTokens",
                [](auto& r) {
                  for (int64_t t : {1, 2, -3, 4}) r.add_loss_tokens(t);
                },
                kInvalid, "loss_tokens[2] = -3"},
        BadCase{"MoreLossTokensThanTokens",
                [](auto& r) {
                  for (int64_t t : {1, 2, 3, 8}) r.add_loss_tokens(t);
                },
                kInvalid, "loss_tokens[3] = 8: must be in [0, lengths[3] = 7]"},
        BadCase{"EqualSizeIsForPartitionOnly",
                [](auto& r) { r.mutable_options()->set_equal_size(true); }, kInvalid,
                "options.equal_size = true applies to Partition only"},
        BadCase{"SumNormWithoutConstant",
                [](auto& r) { r.mutable_loss()->set_mode(v1::LOSS_MODE_SUM_NORM); }, kInvalid,
                "loss.sum_norm_constant = 0"},
        BadCase{"SumNormWithNaN",
                [](auto& r) {
                  r.mutable_loss()->set_mode(v1::LOSS_MODE_SUM_NORM);
                  r.mutable_loss()->set_sum_norm_constant(std::nan(""));
                },
                kInvalid, "loss.sum_norm_constant = nan"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(Validation, StreamNames) {
  ServiceLimits limits;
  EXPECT_THAT(std::string(ValidateStream("", limits).message()), HasSubstr("stream is empty"));
  EXPECT_THAT(std::string(ValidateStream(std::string(129, 'a'), limits).message()),
              HasSubstr("stream is 129 bytes long"));
  EXPECT_THAT(std::string(ValidateStream("a b", limits).message()),
              HasSubstr("byte 32 at position 1"));
  EXPECT_TRUE(ValidateStream("actor_update/v2", limits).ok());
  v1::PlanRequest request = Valid();
  request.set_stream("bad\nname");
  EXPECT_EQ(ToRoundInput(request, limits).status().code(), kInvalid);
}

TEST(Validation, ContentErrorsJoinTheRoundInsteadOfFailingTheCall) {
  v1::PlanRequest request = Valid();
  request.set_lengths(0, -1);
  const absl::StatusOr<RoundInput> input = ToRoundInput(request, {});
  ASSERT_TRUE(input.ok());
  EXPECT_THAT(std::string(input->error.message()), HasSubstr("lengths[0] = -1"));
  // Its options are valid, so it carries the same options fingerprint as a valid rank.
  EXPECT_EQ(input->options_hash, ToRoundInput(Valid(), {})->options_hash);
}

TEST(Conversion, ZeroAndUnspecifiedMeanTheDocumentedDefaults) {
  const absl::StatusOr<PlanInput> input = ToPlanInput(Valid(), {});
  ASSERT_TRUE(input.ok()) << input.status();
  const planner::PlanOptions defaults;
  const planner::PlanOptions& o = input->options;
  EXPECT_EQ(o.max_token_len, 4096);
  EXPECT_EQ(o.cap_mode, defaults.cap_mode);
  EXPECT_EQ(o.min_micro_batches, defaults.min_micro_batches);
  EXPECT_EQ(o.divisible_by, defaults.divisible_by);
  EXPECT_EQ(o.align_to, defaults.align_to);
  EXPECT_EQ(o.align_total_to, defaults.align_total_to);
  EXPECT_EQ(o.algorithm, defaults.algorithm);
  EXPECT_EQ(o.cost, defaults.cost);
  EXPECT_EQ(o.attention.linear, defaults.attention.linear);
  EXPECT_EQ(o.attention.quadratic, defaults.attention.quadratic);
  EXPECT_EQ(o.overlong, defaults.overlong);
  EXPECT_EQ(o.order, defaults.order);
  EXPECT_EQ(o.max_micro_batches, ServiceLimits{}.max_micro_batches);
  EXPECT_TRUE(input->same_micro_num_in_dp);
  EXPECT_FALSE(input->loss_tokens.has_value());
  EXPECT_EQ(input->loss.mode, planner::LossOptions{}.mode);
  EXPECT_EQ(input->lengths, (std::vector<int64_t>{100, 2000, 350, 7}));
}

TEST(Conversion, EveryOptionIsCarried) {
  v1::PlanRequest request = Valid();
  v1::PlanOptions* o = request.mutable_options();
  o->set_cap_mode(v1::CAP_MODE_PADDED);
  o->set_max_seqs_per_micro_batch(3);
  o->set_min_micro_batches(2);
  o->set_divisible_by(2);
  o->set_align_to(8);
  o->set_align_total_to(16);
  o->set_algorithm(v1::ALGORITHM_LPT);
  o->set_cost(v1::COST_MODEL_ATTENTION);
  o->set_attention_linear(0);
  o->set_attention_quadratic(3);
  o->set_overlong(v1::OVERLONG_POLICY_DROP);
  o->set_order(v1::PART_ORDER_INTERLEAVE);
  o->set_max_micro_batches(64);
  o->set_same_micro_num_in_dp(false);
  request.mutable_loss()->set_mode(v1::LOSS_MODE_SUM_NORM);
  request.mutable_loss()->set_sum_norm_constant(4096);
  request.mutable_loss()->set_dp_reduction(v1::DP_REDUCTION_MEAN);
  for (int64_t t : {99, 0, 349, 6}) request.add_loss_tokens(t);
  const absl::StatusOr<PlanInput> input = ToPlanInput(request, {});
  ASSERT_TRUE(input.ok()) << input.status();
  const planner::PlanOptions& p = input->options;
  EXPECT_EQ(p.cap_mode, planner::CapMode::kPadded);
  EXPECT_EQ(p.max_seqs_per_micro_batch, 3);
  EXPECT_EQ(p.min_micro_batches, 2);
  EXPECT_EQ(p.divisible_by, 2);
  EXPECT_EQ(p.align_to, 8);
  EXPECT_EQ(p.align_total_to, 16);
  EXPECT_EQ(p.algorithm, planner::Algorithm::kLpt);
  EXPECT_EQ(p.cost, planner::CostModel::kAttention);
  EXPECT_EQ(p.attention.linear, 0);  // an explicit 0 is kept, not defaulted
  EXPECT_EQ(p.attention.quadratic, 3);
  EXPECT_EQ(p.overlong, planner::OverlongPolicy::kDrop);
  EXPECT_EQ(p.order, planner::PartOrder::kInterleave);
  EXPECT_EQ(p.max_micro_batches, 64);
  EXPECT_FALSE(input->same_micro_num_in_dp);
  EXPECT_EQ(input->loss.mode, planner::LossMode::kSumNorm);
  EXPECT_EQ(input->loss.sum_norm_constant, 4096);
  EXPECT_EQ(input->loss.dp_reduction, planner::DpReduction::kMean);
  EXPECT_EQ(*input->loss_tokens, (std::vector<int64_t>{99, 0, 349, 6}));
}

TEST(Conversion, OptionsHashFollowsOptionsNotLengths) {
  v1::PlanRequest a = Valid();
  v1::PlanRequest b = Valid();
  b.set_lengths(0, 101);
  v1::PlanRequest c = Valid();
  c.mutable_options()->set_max_token_len(4097);
  v1::PlanRequest d = Valid();
  d.mutable_options()->set_min_micro_batches(1);  // explicit default: same options
  const PlanInput ia = *ToPlanInput(a, {});
  const PlanInput ib = *ToPlanInput(b, {});
  EXPECT_EQ(ia.options_hash, ib.options_hash);
  EXPECT_NE(ia.content_hash, ib.content_hash);
  EXPECT_NE(ia.options_hash, ToPlanInput(c, {})->options_hash);
  EXPECT_EQ(ia.content_hash, ToPlanInput(d, {})->content_hash);
}

TEST(Partition, RejectsBadCountsAndAcceptsNoCap) {
  v1::PartitionRequest request;
  for (int64_t length : {5, 6, 7}) request.add_lengths(length);
  v1::PlanResponse response;
  request.set_num_micro_batches(0);
  absl::Status status = RunPartition(request, {}, &response);
  EXPECT_EQ(status.code(), kInvalid);
  EXPECT_THAT(std::string(status.message()), HasSubstr("num_micro_batches = 0"));
  request.set_num_micro_batches(kHuge);
  EXPECT_THAT(std::string(RunPartition(request, {}, &response).message()),
              HasSubstr("num_micro_batches = 1152921504606846976"));
  request.set_num_micro_batches(2);
  request.mutable_global()->set_world_size(-2);
  EXPECT_THAT(std::string(RunPartition(request, {}, &response).message()),
              HasSubstr("global.world_size = -2"));
  request.clear_global();
  ASSERT_TRUE(RunPartition(request, {}, &response).ok());  // max_token_len 0: no cap
  EXPECT_EQ(response.micro_batches_size(), 2);
  EXPECT_EQ(response.num_micro_batches(), 2);
}

TEST(Partition, GlobalCountsBelowThisRequestsOwnAreRejected) {
  v1::PartitionRequest request;
  for (int64_t length : {5, 6, 7}) request.add_lengths(length);
  for (int64_t tokens : {2, 0, 4}) request.add_loss_tokens(tokens);
  request.set_num_micro_batches(2);
  v1::PlanResponse response;
  // `global` set for the world size alone: zero counts would zero every weight.
  request.mutable_global()->set_world_size(4);
  absl::Status status = RunPartition(request, {}, &response);
  EXPECT_EQ(status.code(), kInvalid);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("global.loss_tokens = 0 is below this request's own 6"));
  request.mutable_global()->set_loss_tokens(6);
  request.mutable_global()->set_sequences_with_loss(1);
  EXPECT_THAT(std::string(RunPartition(request, {}, &response).message()),
              HasSubstr("global.sequences_with_loss = 1 is below this request's own 2"));
  request.mutable_global()->set_sequences_with_loss(2);
  request.mutable_global()->set_num_sequences(2);
  EXPECT_THAT(std::string(RunPartition(request, {}, &response).message()),
              HasSubstr("global.num_sequences = 2 is below this request's own 3"));
  // Counts that include this request's own are accepted; num_sequences 0 means this request's.
  request.mutable_global()->set_num_sequences(0);
  request.mutable_global()->set_loss_tokens(24);
  request.mutable_global()->set_sequences_with_loss(8);
  ASSERT_TRUE(RunPartition(request, {}, &response).ok());
  EXPECT_EQ(response.global().num_sequences(), 3);
  EXPECT_EQ(response.global().loss_tokens(), 24);
  EXPECT_EQ(response.global().world_size(), 4);
}

TEST(BalanceBatch, RejectsEqualSize) {
  v1::BalanceBatchRequest request;
  for (int64_t length : {5, 6, 7, 8}) request.add_lengths(length);
  request.mutable_options()->set_max_token_len(100);
  request.mutable_options()->set_equal_size(true);
  request.set_world_size(2);
  v1::BalanceBatchResponse response;
  const absl::Status status = RunBalanceBatch(request, {}, /*stop=*/{}, &response);
  EXPECT_EQ(status.code(), kInvalid);
  EXPECT_THAT(std::string(status.message()), HasSubstr("options.equal_size"));
}

TEST(BalanceBatch, SyncAndMicroBatchCostReachThePlanner) {
  v1::BalanceBatchRequest request;
  for (int64_t length : {50, 60, 70, 80, 10, 20, 30, 40}) request.add_lengths(length);
  request.mutable_options()->set_max_token_len(100);
  request.set_world_size(2);
  request.set_sync(v1::SYNC_MICRO_BATCH);
  request.set_micro_batch_cost(7);
  v1::BalanceBatchResponse response;
  ASSERT_TRUE(RunBalanceBatch(request, {}, /*stop=*/{}, &response).ok());
  planner::PlanOptions o;
  o.max_token_len = 100;
  const absl::StatusOr<planner::BalancedBatch> direct = planner::BalanceBatch(
      {50, 60, 70, 80, 10, 20, 30, 40}, 2, o, {}, {planner::Sync::kMicroBatch, 7});
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(response.step().micro_batch_sync_cost(), direct->step.micro_batch_sync_cost);
  EXPECT_EQ(response.step().step_sync_cost(), direct->step.step_sync_cost);
  EXPECT_EQ(response.step().lower_bound(), direct->step.lower_bound);
  EXPECT_DOUBLE_EQ(response.step().efficiency(), direct->step.efficiency);
  request.set_sync(static_cast<v1::Sync>(9));
  const absl::Status bad = RunBalanceBatch(request, {}, /*stop=*/{}, &response);
  EXPECT_EQ(bad.code(), kInvalid);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("sync"));
  request.set_sync(v1::SYNC_STEP);
  request.set_micro_batch_cost(-1);
  EXPECT_THAT(std::string(RunBalanceBatch(request, {}, /*stop=*/{}, &response).message()),
              HasSubstr("micro_batch_cost = -1"));
}

TEST(BalanceBatch, RejectsBadWorldSizesAndGroups) {
  v1::BalanceBatchRequest request;
  for (int64_t length : {5, 6, 7, 8}) request.add_lengths(length);
  request.mutable_options()->set_max_token_len(100);
  v1::BalanceBatchResponse response;
  request.set_world_size(0);
  EXPECT_THAT(std::string(RunBalanceBatch(request, {}, /*stop=*/{}, &response).message()),
              HasSubstr("world_size = 0"));
  request.set_world_size(2);
  request.add_group_ids(1);
  EXPECT_THAT(std::string(RunBalanceBatch(request, {}, /*stop=*/{}, &response).message()),
              HasSubstr("group_ids has 1 entries for 4 sequences"));
  request.clear_group_ids();
  ServiceLimits limits;
  limits.max_micro_batches = 100;
  request.set_world_size(64);
  request.mutable_options()->set_min_micro_batches(2);
  const absl::Status status = RunBalanceBatch(request, limits, /*stop=*/{}, &response);
  EXPECT_EQ(status.code(), kExhausted);
  EXPECT_THAT(std::string(status.message()), HasSubstr("world_size = 64"));
  request.set_world_size(2);
  request.mutable_options()->set_min_micro_batches(0);
  ASSERT_TRUE(RunBalanceBatch(request, {}, /*stop=*/{}, &response).ok());
  EXPECT_EQ(response.ranks_size(), 2);
}

}  // namespace
}  // namespace packsched::service
