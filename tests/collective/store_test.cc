#include "server/collective/store.h"

#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packsched::collective {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(InMemoryStore, GetBlocksUntilTheKeyIsSet) {
  InMemoryStore store;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(store.Set("a", std::string("x\0y", 3), Soon()).ok());
  });
  absl::StatusOr<std::string> value = store.Get("a", Soon());
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("x\0y", 3));
}

TEST(InMemoryStore, GetOfAMissingKeyIsADeadlineNamingIt) {
  InMemoryStore store;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = store.Get("never", start + absl::Milliseconds(50));
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("'never'"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
}

TEST(InMemoryStore, TryGetDoesNotWait) {
  InMemoryStore store;
  EXPECT_EQ(*store.TryGet("k", Soon()), std::nullopt);
  ASSERT_TRUE(store.Set("k", "v", Soon()).ok());
  EXPECT_THAT(*store.TryGet("k", Soon()), Optional(std::string("v")));
}

TEST(InMemoryStore, CompareAndSetLetsOneOfSeveralBumpsWin) {
  InMemoryStore store;
  EXPECT_EQ(*store.CompareAndSet("gen", std::nullopt, "0", Soon()), "0");
  EXPECT_EQ(*store.CompareAndSet("gen", std::nullopt, "5", Soon()), "0");  // exists: no change
  EXPECT_EQ(*store.CompareAndSet("gen", "0", "1", Soon()), "1");
  EXPECT_EQ(*store.CompareAndSet("gen", "0", "1", Soon()), "1");  // second bump from 0 loses
  EXPECT_EQ(*store.CompareAndSet("gen", "1", "2", Soon()), "2");
  EXPECT_EQ(*store.CompareAndSet("missing", "1", "2", Soon()), "");
  EXPECT_EQ(*store.TryGet("missing", Soon()), std::nullopt);
}

TEST(InMemoryStore, DeletePrefixDeletesOnlyThatPrefix) {
  InMemoryStore store;
  for (const char* key : {"g1/a", "g1/b", "g10/a", "g2/a", "g0"}) {
    ASSERT_TRUE(store.Set(key, "v", Soon()).ok());
  }
  EXPECT_EQ(*store.DeletePrefix("g1/", Soon()), 2);
  EXPECT_EQ(store.size(), 3);
  EXPECT_EQ(*store.TryGet("g10/a", Soon()), "v");
}

TEST(InMemoryStore, AWatchOfAnExistingKeyFiresAtOnce) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("k", "v", Soon()).ok());
  std::vector<std::string> seen;
  const int64_t id = store.Watch("k", [&](std::string value) { seen.push_back(value); });
  EXPECT_EQ(seen, std::vector<std::string>{"v"});
  EXPECT_FALSE(store.CancelWatch(id));
}

TEST(InMemoryStore, ACompareAndSetThatCreatesAKeyFiresItsWatches) {
  // What a remote Get waits on: a key first written by compare-and-set must wake it too.
  InMemoryStore store;
  std::vector<std::string> seen;
  store.Watch("k", [&](std::string value) { seen.push_back(value); });
  EXPECT_EQ(*store.CompareAndSet("k", "absent", "x", Soon()), "");  // no match: nothing stored
  EXPECT_TRUE(seen.empty());
  EXPECT_EQ(*store.CompareAndSet("k", std::nullopt, "first", Soon()), "first");
  EXPECT_EQ(seen, std::vector<std::string>{"first"});
}

TEST(InMemoryStore, WatchesFireOnceFromTheSetThatCreatesTheKey) {
  InMemoryStore store;
  std::vector<std::string> seen;
  store.Watch("k", [&](std::string value) { seen.push_back("a:" + value); });
  // A callback may use the store (it runs without the lock held).
  store.Watch("k", [&](std::string value) {
    seen.push_back("b:" + value);
    EXPECT_TRUE(store.Set("echo", value, Soon()).ok());
  });
  EXPECT_TRUE(seen.empty());
  ASSERT_TRUE(store.Set("k", "1", Soon()).ok());
  ASSERT_TRUE(store.Set("k", "2", Soon()).ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"a:1", "b:1"}));
  EXPECT_EQ(*store.TryGet("echo", Soon()), "1");
}

TEST(InMemoryStore, ACancelledWatchNeverFires) {
  InMemoryStore store;
  bool fired = false;
  const int64_t cancelled = store.Watch("k", [&](std::string) { fired = true; });
  int kept = 0;
  const int64_t other = store.Watch("k", [&](std::string) { ++kept; });
  EXPECT_TRUE(store.CancelWatch(cancelled));
  EXPECT_FALSE(store.CancelWatch(cancelled));
  ASSERT_TRUE(store.Set("k", "v", Soon()).ok());
  EXPECT_FALSE(fired);
  EXPECT_EQ(kept, 1);
  EXPECT_FALSE(store.CancelWatch(other));  // already ran
}

}  // namespace
}  // namespace packsched::collective
