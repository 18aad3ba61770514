#include "server/base/logging.h"

#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

namespace packsched {
namespace {

TEST(InitLogging, AcceptsKnownLevelAndRejectsUnknown) {
  ASSERT_TRUE(InitLogging("logging_test", "warn").ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);
  const absl::Status bad = InitLogging("logging_test_bad", "loud");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("loud"), absl::string_view::npos);
}

}  // namespace
}  // namespace packsched
