// The --backend=auto agreement through the rendezvous store: NCCL only if every rank can.

#include "server/group/backend_agreement.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "server/group/group_keys.h"

namespace packsched::group {
namespace {

using collective::Backend;
using collective::InMemoryStore;

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

TEST(BackendAgreement, AutoIsNcclOnlyWhenEveryRankCan) {
  for (const auto& result : Agree({true, true, true, true})) EXPECT_EQ(*result, Backend::kNccl);
  for (const auto& result : Agree({true, true, false, true})) EXPECT_EQ(*result, Backend::kGloo);
  for (const auto& result : Agree({false, true, true})) EXPECT_EQ(*result, Backend::kGloo);
}

TEST(BackendAgreement, RankZeroWithoutNcclDecidesWithoutWaitingForTheOthers) {
  InMemoryStore store;
  // Nobody else has answered; rank 0 cannot use NCCL, so the answer is already known.
  auto decided = AgreeOnBackend(store, "run/", 0, 8, false, absl::Now() + absl::Milliseconds(50));
  ASSERT_TRUE(decided.ok()) << decided.status();
  EXPECT_EQ(*decided, Backend::kGloo);
  EXPECT_EQ(*store.TryGet(keys::Backend("run/"), Soon()), "gloo");
}

TEST(BackendAgreement, AMissingAnswerIsADeadline) {
  InMemoryStore store;
  auto decided = AgreeOnBackend(store, "run/", 0, 2, true, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(decided.status().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace packsched::group
