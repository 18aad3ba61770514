// RequestFromFlags / FormatFromFlags: flag values to a PlanRequest, bad values named.

#include "server/cli/plan_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/options.h"
#include "tests/testing/temp_dir.h"

ABSL_DECLARE_FLAG(std::string, algorithm);
ABSL_DECLARE_FLAG(std::string, cost);
ABSL_DECLARE_FLAG(std::string, attention_cost);
ABSL_DECLARE_FLAG(std::string, order);
ABSL_DECLARE_FLAG(std::string, overlong);
ABSL_DECLARE_FLAG(std::string, cap_mode);
ABSL_DECLARE_FLAG(std::string, format);
ABSL_DECLARE_FLAG(int64_t, max_token_len);
ABSL_DECLARE_FLAG(int64_t, num_parts);
ABSL_DECLARE_FLAG(int64_t, align_to);
ABSL_DECLARE_FLAG(bool, equal_size);
ABSL_DECLARE_FLAG(std::string, lengths);
ABSL_DECLARE_FLAG(std::string, tree);
ABSL_DECLARE_FLAG(std::string, model_config);

namespace packsched::cli {
namespace {

using ::testing::HasSubstr;

using ::packsched::testing::TempDir;

TEST(PlanFlagsTest, DefaultsAreThePlannersDefaults) {
  absl::FlagSaver saver;
  const absl::StatusOr<PlanRequest> request = RequestFromFlags();
  ASSERT_TRUE(request.ok()) << request.status();
  const planner::PlanOptions defaults;
  EXPECT_EQ(request->num_parts, 0);
  EXPECT_EQ(request->options.algorithm, defaults.algorithm);
  EXPECT_EQ(request->options.cost, defaults.cost);
  EXPECT_EQ(request->options.overlong, defaults.overlong);
  EXPECT_EQ(request->options.order, defaults.order);
  EXPECT_EQ(request->options.max_micro_batches, defaults.max_micro_batches);
  EXPECT_EQ(request->options.attention.linear, defaults.attention.linear);
  EXPECT_EQ(*FormatFromFlags(), OutputFormat::kTable);
}

TEST(PlanFlagsTest, EveryFlagReachesTheRequest) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_algorithm, "lpt");
  absl::SetFlag(&FLAGS_cost, "attention");
  absl::SetFlag(&FLAGS_attention_cost, "7,3");
  absl::SetFlag(&FLAGS_order, "interleave");
  absl::SetFlag(&FLAGS_overlong, "drop");
  absl::SetFlag(&FLAGS_cap_mode, "padded");
  absl::SetFlag(&FLAGS_max_token_len, 4096);
  absl::SetFlag(&FLAGS_num_parts, 12);
  absl::SetFlag(&FLAGS_align_to, 64);
  absl::SetFlag(&FLAGS_equal_size, true);
  absl::SetFlag(&FLAGS_format, "json");
  const absl::StatusOr<PlanRequest> request = RequestFromFlags();
  ASSERT_TRUE(request.ok()) << request.status();
  const planner::PlanOptions& o = request->options;
  EXPECT_EQ(o.algorithm, planner::Algorithm::kLpt);
  EXPECT_EQ(o.cost, planner::CostModel::kAttention);
  EXPECT_EQ(o.attention.linear, 7);
  EXPECT_EQ(o.attention.quadratic, 3);
  EXPECT_EQ(o.order, planner::PartOrder::kInterleave);
  EXPECT_EQ(o.overlong, planner::OverlongPolicy::kDrop);
  EXPECT_EQ(o.cap_mode, planner::CapMode::kPadded);
  EXPECT_EQ(o.max_token_len, 4096);
  EXPECT_EQ(request->num_parts, 12);
  EXPECT_EQ(o.align_to, 64);
  EXPECT_TRUE(o.equal_size);
  EXPECT_EQ(*FormatFromFlags(), OutputFormat::kJson);
}

TEST(PlanFlagsTest, BadValuesNameTheFlag) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_order, "random");
  EXPECT_THAT(RequestFromFlags().status().message(), HasSubstr("--order=random"));
  absl::SetFlag(&FLAGS_order, "index");
  absl::SetFlag(&FLAGS_cost, "attention");
  for (const char* bad : {"7", "7,", "a,b", "1,2,3"}) {
    absl::SetFlag(&FLAGS_attention_cost, bad);
    EXPECT_THAT(RequestFromFlags().status().message(), HasSubstr("--attention_cost=")) << bad;
  }
  absl::SetFlag(&FLAGS_attention_cost, "-1,1");
  EXPECT_EQ(RequestFromFlags().status().message(),
            "--attention_cost=-1,1: each weight must be 0..4294967296");
  absl::SetFlag(&FLAGS_attention_cost, "0,0");
  EXPECT_EQ(RequestFromFlags().status().message(),
            "--attention_cost=0,0: both weights 0 make every cost 0");
  absl::SetFlag(&FLAGS_cost, "tokens");
  absl::SetFlag(&FLAGS_attention_cost, "1,1");
  EXPECT_THAT(RequestFromFlags().status().message(), HasSubstr("only with --cost=attention"));
  absl::SetFlag(&FLAGS_format, "yaml");
  EXPECT_THAT(FormatFromFlags().status().message(), HasSubstr("--format=yaml"));
}

// The files the flags name are checked before anything is read; "-" is stdin.
TEST(PlanFlagsTest, InputFilesAreCheckedFirst) {
  absl::FlagSaver saver;
  TempDir dir;
  EXPECT_TRUE(CheckInputFlags().ok());
  absl::SetFlag(&FLAGS_lengths, "-");
  absl::SetFlag(&FLAGS_tree, "/dev/null");
  EXPECT_TRUE(CheckInputFlags().ok());
  absl::SetFlag(&FLAGS_lengths, dir.path());
  EXPECT_EQ(CheckInputFlags().message(),
            "--lengths=" + dir.path() + ": is a directory, not a file");
  absl::SetFlag(&FLAGS_lengths, "");
  absl::SetFlag(&FLAGS_tree, dir.File("missing"));
  EXPECT_EQ(CheckInputFlags().message(), "--tree=" + dir.File("missing") + ": no such file");
  absl::SetFlag(&FLAGS_tree, "");
  absl::SetFlag(&FLAGS_model_config, "/dev/null");  // a config is a regular file
  EXPECT_EQ(CheckInputFlags().message(), "--model_config=/dev/null: is not a regular file");
}

TEST(PlanFlagsTest, HelpListsEveryPlanFlagWithItsDefault) {
  const std::string help = HelpText();
  for (const char* flag :
       {"--lengths", "--max_token_len=0", "--num_parts=0", "--equal_size=false", "--algorithm=kk",
        "--cap_mode=tokens", "--max_seqs_per_micro_batch=0", "--min_micro_batches=1",
        "--divisible_by=1", "--align_to=1", "--align_total_to=1", "--cost=tokens",
        "--attention_cost", "--overlong=reject", "--order=cost_desc", "--max_micro_batches=1000000",
        "--format=table"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
}

}  // namespace
}  // namespace packsched::cli
