// Backend choice: parsing, the --backend=auto agreement through the store, and forming.

#include "server/collective/backend.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/group_keys.h"
#include "server/collective/store.h"

namespace packsched::collective {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// Every rank runs AgreeOnBackend with its own capability; returns the decisions by rank.
std::vector<absl::StatusOr<Backend>> Agree(const std::vector<bool>& capable) {
  InMemoryStore store;
  std::vector<absl::StatusOr<Backend>> decided(capable.size(), absl::UnknownError("unset"));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < capable.size(); ++r) {
    threads.emplace_back([&, r] {
      decided[r] = AgreeOnBackend(store, "run/", r, capable.size(), capable[r], Soon());
    });
  }
  for (std::thread& t : threads) t.join();
  return decided;
}

TEST(Backend, ParsesEveryNameAndRejectsOthers) {
  for (Backend backend : {Backend::kAuto, Backend::kGloo, Backend::kNccl, Backend::kLocal}) {
    EXPECT_EQ(*ParseBackend(BackendName(backend)), backend);
  }
  EXPECT_EQ(ParseBackend("NCCL").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Backend, AutoIsNcclOnlyWhenEveryRankCan) {
  for (const auto& result : Agree({true, true, true, true})) EXPECT_EQ(*result, Backend::kNccl);
  for (const auto& result : Agree({true, true, false, true})) EXPECT_EQ(*result, Backend::kGloo);
  for (const auto& result : Agree({false, true, true})) EXPECT_EQ(*result, Backend::kGloo);
}

TEST(Backend, RankZeroWithoutNcclDecidesWithoutWaitingForTheOthers) {
  InMemoryStore store;
  // Nobody else has answered; rank 0 cannot use NCCL, so the answer is already known.
  auto decided = AgreeOnBackend(store, "run/", 0, 8, false, absl::Now() + absl::Milliseconds(50));
  ASSERT_TRUE(decided.ok()) << decided.status();
  EXPECT_EQ(*decided, Backend::kGloo);
  EXPECT_EQ(*store.TryGet(keys::Backend("run/"), Soon()), "gloo");
}

TEST(Backend, AMissingAnswerIsADeadline) {
  InMemoryStore store;
  auto decided = AgreeOnBackend(store, "run/", 0, 2, true, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(decided.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(Backend, FormsOnlyConcreteBackends) {
  InMemoryStore store;
  const GlooOptions gloo;
  const NcclOptions nccl;
  auto local = FormCollective(Backend::kLocal, store, "p/", 0, 1, gloo, nccl, Soon());
  ASSERT_TRUE(local.ok());
  EXPECT_EQ((*local)->backend(), "local");
  EXPECT_EQ(FormCollective(Backend::kLocal, store, "p/", 0, 2, gloo, nccl, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FormCollective(Backend::kAuto, store, "p/", 0, 1, gloo, nccl, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace packsched::collective
