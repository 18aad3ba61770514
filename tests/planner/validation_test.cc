// Bad input gives InvalidArgument naming the field and the value, before anything is planned.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/planner.h"

namespace packsched::planner {
namespace {

using ::testing::HasSubstr;

PlanOptions Capped(int64_t cap) {
  PlanOptions o;
  o.max_token_len = cap;
  return o;
}

void ExpectInvalid(const absl::Status& status, const std::string& mentions) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(mentions));
}

// The options alone, before any length: what the entry points would refuse, in their words.
TEST(CheckOptions, TheEntryPointsRulesWithoutLengths) {
  EXPECT_TRUE(CheckOptions(PlanOptions()).ok());  // no cap: PartitionFixedK needs none
  PlanOptions packing = Capped(100);
  packing.algorithm = Algorithm::kBestFitDecreasing;
  EXPECT_TRUE(CheckOptions(packing).ok());
  PlanOptions bad = Capped(100);
  bad.min_micro_batches = 0;
  ExpectInvalid(CheckOptions(bad), "min_micro_batches = 0: must be in [1, 1000000]");
  EXPECT_EQ(CheckOptions(bad).message(), PlanMicroBatches({5}, bad).status().message());
  bad = Capped(-1);
  ExpectInvalid(CheckOptions(bad), "max_token_len = -1");
  bad = Capped(100);
  bad.context_parallel = 2;
  bad.align_to = 3;
  ExpectInvalid(CheckOptions(bad), "align_to = 3 is not a multiple of 4");
}

TEST(Validation, NonPositiveLengthNamesIndexAndValue) {
  ExpectInvalid(PlanMicroBatches({5, 0, 3}, Capped(100)).status(), "lengths[1] = 0");
  ExpectInvalid(PlanMicroBatches({-7}, Capped(100)).status(), "lengths[0] = -7");
}

TEST(Validation, CapMustBePositiveUnlessKIsGiven) {
  ExpectInvalid(PlanMicroBatches({5}, Capped(0)).status(), "max_token_len = 0");
  EXPECT_TRUE(PartitionFixedK({5, 6}, 2, Capped(0)).ok());
}

TEST(Validation, FixedKBelowOneOrBelowTheBoundIsRejected) {
  ExpectInvalid(PartitionFixedK({5, 6}, 0, Capped(0)).status(), "k = 0");
  // Three sequences of 8 under a cap of 10 cannot share parts: k = 2 is below the bound 3.
  ExpectInvalid(PartitionFixedK({8, 8, 8}, 2, Capped(10)).status(), "k = 2");
}

TEST(Validation, OverlongUnderRejectNamesSequenceAndLength) {
  ExpectInvalid(PlanMicroBatches({10, 120, 10}, Capped(100)).status(), "sequence 1 has length 120");
}

TEST(Validation, AlignmentCountsTowardsOverlong) {
  PlanOptions o = Capped(100);
  o.align_to = 64;  // 65 aligns to 128 > 100
  ExpectInvalid(PlanMicroBatches({65}, o).status(), "aligned 128");
}

TEST(Validation, OptionsOutOfRangeNameFieldAndValue) {
  struct Bad {
    void (*mutate)(PlanOptions&);
    std::string mentions;
  };
  const std::vector<Bad> cases = {
      {[](PlanOptions& o) { o.min_micro_batches = 0; }, "min_micro_batches = 0"},
      {[](PlanOptions& o) { o.min_micro_batches = 2'000'000; }, "min_micro_batches = 2000000"},
      {[](PlanOptions& o) { o.divisible_by = 0; }, "divisible_by = 0"},
      {[](PlanOptions& o) { o.divisible_by = int64_t{1} << 40; }, "divisible_by = 1099511627776"},
      {[](PlanOptions& o) { o.align_to = 0; }, "align_to = 0"},
      {[](PlanOptions& o) { o.align_total_to = -4; }, "align_total_to = -4"},
      {[](PlanOptions& o) { o.max_seqs_per_micro_batch = -1; }, "max_seqs_per_micro_batch = -1"},
      {[](PlanOptions& o) { o.max_micro_batches = 0; }, "max_micro_batches = 0"},
      {[](PlanOptions& o) { o.max_token_len = int64_t{1} << 40; }, "max_token_len = 1099511627776"},
      {[](PlanOptions& o) { o.cap_mode = static_cast<CapMode>(9); }, "cap_mode = 9"},
      {[](PlanOptions& o) { o.algorithm = static_cast<Algorithm>(-1); }, "algorithm = -1"},
      {[](PlanOptions& o) { o.order = static_cast<PartOrder>(3); }, "order = 3"},
      {[](PlanOptions& o) { o.overlong = static_cast<OverlongPolicy>(5); }, "overlong = 5"},
      {[](PlanOptions& o) { o.algorithm = Algorithm::kFirstFitDecreasing; }, "algorithm ffd"},
      {[](PlanOptions& o) {
         o.cost = CostModel::kAttention;
         o.attention = {-1, 1};
       },
       "attention.linear = -1"},
      {[](PlanOptions& o) {
         o.cost = CostModel::kAttention;
         o.attention = {0, 0};
       },
       "both 0"},
      {[](PlanOptions& o) { o.align_total_to = 512; }, "below align_total_to = 512"},
  };
  for (const Bad& bad : cases) {
    PlanOptions o = Capped(100);
    bad.mutate(o);
    ExpectInvalid(PlanMicroBatches({10, 20}, o).status(), bad.mentions);
  }
}

TEST(Validation, RequiredCountAboveMaxMicroBatchesIsRejectedNotClamped) {
  PlanOptions o = Capped(10);
  o.max_micro_batches = 2;
  ExpectInvalid(PlanMicroBatches({10, 10, 10}, o).status(), "max_micro_batches = 2");
  o.max_micro_batches = 4;
  o.divisible_by = 4;  // 3 rounds up to 4: still allowed
  EXPECT_TRUE(PlanMicroBatches({10, 10, 10}, o).ok());
  o.divisible_by = 3;
  o.min_micro_batches = 4;  // 4 rounds up to 6 > 4
  ExpectInvalid(PlanMicroBatches({10, 10, 10}, o).status(), "divisible_by = 3");
}

TEST(Validation, AttentionCostOverflowIsRejected) {
  PlanOptions o = Capped(kMaxLength);
  o.cost = CostModel::kAttention;
  o.attention = {kMaxAttentionWeight, kMaxAttentionWeight};
  ExpectInvalid(PlanMicroBatches({2'000'000'000}, o).status(), "overflows int64");
}

TEST(Validation, EqualSizeNeedsFixedKDividingN) {
  PlanOptions o = Capped(0);
  o.equal_size = true;
  ExpectInvalid(PartitionFixedK({1, 2, 3, 4, 5}, 2, o).status(), "equal_size");
  PlanOptions capped = Capped(10);
  capped.equal_size = true;
  ExpectInvalid(PlanMicroBatches({1, 2}, capped).status(), "equal_size");
}

TEST(Validation, EqualSizeKeepsEverySequenceSoOnlyRejectIsAccepted) {
  // A 7-token sequence over a cap of 6: equal_size keeps it (counts, not the cap), so a policy
  // that would drop or isolate it is an error, never silently ignored.
  PlanOptions o = Capped(6);
  o.equal_size = true;
  const absl::StatusOr<MicroBatchPlan> kept = PartitionFixedK({5, 3, 7}, 3, o);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->dropped.empty());
  for (const OverlongPolicy policy : {OverlongPolicy::kDrop, OverlongPolicy::kIsolate}) {
    o.overlong = policy;
    ExpectInvalid(PartitionFixedK({5, 3, 7}, 3, o).status(),
                  std::string("overlong = ") + std::string(Name(policy)));
  }
}

TEST(Validation, UncappedBatchMustFitInt32Offsets) {
  const std::vector<int64_t> lengths(3, int64_t{1} << 30);
  ExpectInvalid(PartitionFixedK(lengths, 3, Capped(0)).status(), "int32");
}

TEST(Validation, PartitionRejectsKOutsideTheAgreedRange) {
  PlanOptions o = Capped(10);
  o.divisible_by = 2;
  o.max_micro_batches = 10;
  const absl::StatusOr<Problem> problem = Problem::Create({10, 10, 10}, o);
  ASSERT_TRUE(problem.ok());
  EXPECT_EQ(problem->local_k(), 4);
  ExpectInvalid(problem->Partition(2).status(), "k = 2");
  ExpectInvalid(problem->Partition(5).status(), "not a multiple of divisible_by = 2");
  ExpectInvalid(problem->Partition(12).status(), "k = 12");
  EXPECT_TRUE(problem->Partition(6).ok());
}

}  // namespace
}  // namespace packsched::planner

namespace packsched::planner {
namespace {

TEST(ContextParallel, RangesAndAlignmentMultiplesAreChecked) {
  PlanOptions o;
  o.max_token_len = 1000;
  o.context_parallel = 0;
  EXPECT_THAT(std::string(PlanMicroBatches({5}, o).status().message()),
              HasSubstr("context_parallel = 0"));
  o.context_parallel = 2;
  o.tensor_parallel = 0;
  EXPECT_THAT(std::string(PlanMicroBatches({5}, o).status().message()),
              HasSubstr("tensor_parallel = 0"));
  o.tensor_parallel = 2;
  o.align_to = 4;  // not a multiple of 2 * 2 * 2
  EXPECT_THAT(std::string(PlanMicroBatches({5}, o).status().message()),
              HasSubstr("align_to = 4 is not a multiple of 8"));
  o.context_parallel = int64_t{1} << 10;
  o.tensor_parallel = int64_t{1} << 10;
  o.align_to = 1;
  EXPECT_EQ(PlanMicroBatches({5}, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ContextParallel, AlignDefaultsAndTheAttentionCostIsSharedOverTheRanks) {
  PlanOptions o;
  o.max_token_len = 4096;
  o.cost = CostModel::kAttention;
  o.attention = {10, 1};
  o.context_parallel = 4;
  o.tensor_parallel = 2;
  const std::vector<int64_t> lengths = {1, 15, 16, 17, 100, 300};
  absl::StatusOr<MicroBatchPlan> plan = PlanMicroBatches(lengths, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t aligned = 0;
  for (const MicroBatch& part : plan->parts) {
    int64_t part_cost = 0;  // (a * L + b * L^2) / cp per sequence
    for (size_t i = 0; i + 1 < part.cu_seqlens_aligned.size(); ++i) {
      const int64_t len = part.cu_seqlens_aligned[i + 1] - part.cu_seqlens_aligned[i];
      EXPECT_EQ(len % 16, 0) << "2 * cp * tp";
      aligned += len;
      part_cost += (10 * len + len * len) / 4;
    }
    EXPECT_EQ(part.cost, part_cost);
  }
  // Every length rounded up to 16 by hand: 16, 16, 16, 32, 112, 304.
  EXPECT_EQ(aligned, 16 + 16 + 16 + 32 + 112 + 304);
}

}  // namespace
}  // namespace packsched::planner
