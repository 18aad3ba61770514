// The NCCL backend: a one-rank group runs where a GPU is present and skips cleanly otherwise;
// without a GPU (or without the backend) Create fails cleanly instead of crashing.

#include "server/collective/nccl_collective.h"

#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"

namespace packsched::collective {
namespace {

using ::testing::ElementsAre;

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST(NcclCollective, WithoutAGpuCreateFailsCleanly) {
  if (GpuAvailable()) GTEST_SKIP() << "a GPU is present";
  InMemoryStore store;
  auto created = NcclCollective::Create(store, "nccl/0/", 0, 1, NcclOptions{}, Soon());
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(),
            NcclBuilt() ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kUnimplemented);
}

TEST(NcclCollective, OneRankReducesAndGathers) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU (or no NCCL backend in this build)";
  setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
  InMemoryStore store;
  auto created = NcclCollective::Create(store, "nccl/1/", 0, 1, NcclOptions{}, Soon());
  ASSERT_TRUE(created.ok()) << created.status();
  NcclCollective& nccl = **created;
  std::vector<int64_t> values = {5, -7, 11, 3};
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                                     ReduceOp::kSum};
  ASSERT_TRUE(nccl.AllReduce(absl::MakeSpan(values), ops, Soon()).ok());
  EXPECT_THAT(values, ElementsAre(5, -7, 11, 3));
  const std::vector<int64_t> record = {1, 2, 3};
  std::vector<int64_t> out(3);
  ASSERT_TRUE(nccl.AllGather(record, absl::MakeSpan(out), Soon()).ok());
  EXPECT_THAT(out, ElementsAre(1, 2, 3));
  nccl.Abort();
  EXPECT_EQ(nccl.AllReduce(absl::MakeSpan(values), ops, Soon()).code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace packsched::collective
