// PlanTable and FillBar: what a person reads.

#include "server/cli/table_output.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cli/plan_command.h"

namespace packsched::cli {
namespace {

using ::testing::HasSubstr;

TEST(FillBarTest, FillsTheShareAndClamps) {
  EXPECT_EQ(FillBar(0.5, 10), "#####     ");
  EXPECT_EQ(FillBar(0.0, 4), "    ");
  EXPECT_EQ(FillBar(1.7, 4), "####");
  EXPECT_EQ(FillBar(-1.0, 4), "    ");
  EXPECT_EQ(FillBar(std::nan(""), 4), "    ");
}

TEST(PlanTableTest, OneRowPerMicroBatchThenASummary) {
  PlanRequest request;
  request.options.max_token_len = 10;
  request.options.overlong = planner::OverlongPolicy::kIsolate;
  const std::vector<int64_t> lengths = {6, 4, 5, 5, 12};
  absl::StatusOr<PlanRun> run = RunPlan(lengths, request);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string table = PlanTable(*run);
  const std::vector<std::string> lines = absl::StrSplit(table, '\n');
  int rows = 0;
  for (const std::string& line : lines) rows += line.find('|') != std::string::npos ? 1 : 0;
  EXPECT_EQ(rows, static_cast<int>(run->plan.parts.size()));
  EXPECT_THAT(table, HasSubstr("5 sequences, 32 tokens -> 3 micro-batches (kk, cap 10 tokens)"));
  EXPECT_THAT(table, HasSubstr("|##############################|  120.0%  overlong"));
  EXPECT_THAT(table, HasSubstr("over the cap         1 micro-batches (1 holding one sequence"));
  EXPECT_THAT(table, HasSubstr("a naive [5 x 12] batch holds 60 tokens"));
  EXPECT_THAT(table, HasSubstr("planning time"));
  // No alignment: every row is a real token, executed = logical = forwarded.
  EXPECT_THAT(table, HasSubstr("logical 32, executed 32 (rows, padding included), forwarded 32"));
  request.options.align_to = 4;
  run = RunPlan(lengths, request);
  ASSERT_TRUE(run.ok()) << run.status();
  // Aligned lengths 8, 4, 8, 8, 12: 40 rows for the same 32 tokens.
  EXPECT_THAT(PlanTable(*run), HasSubstr("logical 32, executed 40"));
}

TEST(PlanTableTest, TheCostFormulaNamesTheWindowedAndChunkedTerms) {
  PlanRequest request;
  request.options.max_token_len = 10;
  request.options.cost = planner::CostModel::kAttention;
  request.options.attention = {
      .linear = 7, .quadratic = 1, .windowed = 3, .window = 4, .chunked = 2, .chunk = 8};
  absl::StatusOr<PlanRun> run = RunPlan(std::vector<int64_t>{6, 4, 5}, request);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_THAT(PlanTable(*run), HasSubstr("cost 7*L + 1*L^2 + 3*window(L, 4) + 2*chunks(L, 8)"));
}

TEST(PlanTableTest, WithoutACapFillIsAgainstTheLargestPart) {
  PlanRequest request;
  request.num_parts = 2;
  const std::vector<int64_t> lengths = {4, 4, 2};
  absl::StatusOr<PlanRun> run = RunPlan(lengths, request);
  ASSERT_TRUE(run.ok()) << run.status();
  const std::string table = PlanTable(*run);
  EXPECT_THAT(table, HasSubstr("fill of largest"));
  EXPECT_THAT(table, HasSubstr("|##############################|  100.0%"));
  // {4, 2} and {4}: 6 and 4 tokens.
  EXPECT_THAT(table, HasSubstr("|####################          |   66.7%"));
  EXPECT_THAT(table, ::testing::Not(HasSubstr("over the cap")));
}

TEST(PlanTableTest, EqualSizeCountsASingleSequenceOverTheCapAsUnavoidable) {
  // equal_size does not apply the cap: one sequence per part, and the 7-token one is over it.
  PlanRequest request;
  request.num_parts = 3;
  request.options.max_token_len = 6;
  request.options.equal_size = true;
  const std::vector<int64_t> lengths = {5, 3, 7};
  absl::StatusOr<PlanRun> run = RunPlan(lengths, request);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->plan.stats.over_cap_parts, 1);
  int64_t single_over = 0;
  for (const planner::MicroBatch& part : run->plan.parts) {
    single_over += part.indices.size() == 1 && part.tokens > 6 ? 1 : 0;
  }
  const std::string table = PlanTable(*run);
  EXPECT_THAT(table, HasSubstr(absl::StrCat("over the cap         ", run->plan.stats.over_cap_parts,
                                            " micro-batches (", single_over, " holding one")));
}

}  // namespace
}  // namespace packsched::cli
