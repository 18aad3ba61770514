#include "server/base/status_macros.h"

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace packsched {
namespace {

int calls = 0;

absl::Status Counted(absl::Status s) {
  ++calls;
  return s;
}

absl::Status Twice(absl::Status first) {
  RETURN_IF_ERROR(Counted(first));
  RETURN_IF_ERROR(Counted(absl::OkStatus()));
  return absl::OkStatus();
}

TEST(ReturnIfError, ReturnsFirstErrorAndEvaluatesOnce) {
  calls = 0;
  EXPECT_EQ(Twice(absl::NotFoundError("x")).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls, 1);
  calls = 0;
  EXPECT_TRUE(Twice(absl::OkStatus()).ok());
  EXPECT_EQ(calls, 2);
}

absl::StatusOr<std::unique_ptr<int>> MakeInt(bool ok) {
  if (!ok) return absl::InvalidArgumentError("no");
  return std::make_unique<int>(7);
}

absl::StatusOr<int> AddOne(bool ok) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> v, MakeInt(ok));  // move-only values work
  return *v + 1;
}

TEST(AssignOrReturn, MovesValueOrReturnsError) {
  EXPECT_EQ(AddOne(true).value(), 8);
  EXPECT_EQ(AddOne(false).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace packsched
