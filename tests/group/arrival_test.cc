#include "server/group/arrival.h"

#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"

namespace packsched::group {
namespace {

using collective::InMemoryStore;

constexpr absl::Duration kDelay = absl::Milliseconds(50);

bool Present(InMemoryStore& store, const std::string& key) {
  absl::StatusOr<std::optional<std::string>> value = store.TryGet(key, absl::Now());
  return value.ok() && value->has_value();
}

TEST(ArrivalPublisher, AFastRoundWritesNothing) {
  InMemoryStore store;
  ArrivalPublisher publisher(store, kDelay);
  for (int round = 0; round < 20; ++round) {
    publisher.Begin("arrive/" + std::to_string(round) + "/0/", absl::Now() + absl::Seconds(5));
    EXPECT_FALSE(publisher.End());
  }
  absl::SleepFor(2 * kDelay);  // nothing due is left behind either
  EXPECT_EQ(store.size(), 0);
}

TEST(ArrivalPublisher, ASlowRoundPublishesItsKeyWhileItWaits) {
  InMemoryStore store;
  ArrivalPublisher publisher(store, kDelay);
  publisher.Begin("arrive/7/3/", absl::Now() + absl::Seconds(5));
  // What a peer that times out reads: present while the round still waits.
  EXPECT_TRUE(store.Get("arrive/7/3/", absl::Now() + absl::Seconds(5)).ok());
  EXPECT_TRUE(publisher.End());
  // The next round starts clean: a fast one publishes nothing and reports so.
  publisher.Begin("arrive/8/3/", absl::Now() + absl::Seconds(5));
  EXPECT_FALSE(publisher.End());
  EXPECT_FALSE(Present(store, "arrive/8/3/"));
  // A slow one again.
  publisher.Begin("arrive/9/3/", absl::Now() + absl::Seconds(5));
  absl::SleepFor(3 * kDelay);
  EXPECT_TRUE(Present(store, "arrive/9/3/"));
  EXPECT_TRUE(publisher.End());
}

TEST(ArrivalPublisher, StopsPromptlyInTheMiddleOfARound) {
  InMemoryStore store;
  const absl::Time start = absl::Now();
  {
    ArrivalPublisher publisher(store, absl::Seconds(30));
    publisher.Begin("arrive/1/0/", absl::Now() + absl::Seconds(60));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(Present(store, "arrive/1/0/"));
}

}  // namespace
}  // namespace packsched::group
