#include "server/collective/gloo_collective.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "tests/collective/gloo_group.h"
#include "tests/collective/run_ranks.h"

namespace packsched::collective {
namespace {

using ::testing::ElementsAreArray;
using testing::FormGlooGroup;
using testing::FreshPrefix;
using ::testing::HasSubstr;
using testing::Loopback;
using testing::RunRanks;

constexpr int64_t kLow = std::numeric_limits<int64_t>::min();
constexpr int64_t kHigh = std::numeric_limits<int64_t>::max();

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// Rank r's contribution: values that differ per rank in sign and size, extremes included.
std::vector<int64_t> Values(int64_t r) {
  return {r * 7 - 3, -r * r, r + 1, r == 1 ? kLow : r, r == 2 ? kHigh : -r, 1000 * r};
}
const std::vector<ReduceOp> kOps = {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kSum,
                                    ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum};

std::vector<int64_t> Expected(int64_t world_size) {
  std::vector<int64_t> expected = Values(0);
  for (int64_t r = 1; r < world_size; ++r) {
    const std::vector<int64_t> v = Values(r);
    for (size_t i = 0; i < v.size(); ++i) {
      if (kOps[i] == ReduceOp::kMax) expected[i] = std::max(expected[i], v[i]);
      if (kOps[i] == ReduceOp::kMin) expected[i] = std::min(expected[i], v[i]);
      if (kOps[i] == ReduceOp::kSum) expected[i] += v[i];
    }
  }
  return expected;
}

void ExpectReduces(int64_t world_size, GlooOptions::Algorithm algorithm) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, world_size, absl::Seconds(10), Loopback(algorithm));
  ASSERT_TRUE(group.ok()) << group.status();
  auto results = RunRanks<std::vector<int64_t>>(*group, [](Collective& rank) {
    std::vector<int64_t> values = Values(rank.rank());
    const absl::Status status = rank.AllReduce(absl::MakeSpan(values), kOps, Soon());
    EXPECT_TRUE(status.ok()) << status;
    return values;
  });
  for (const auto& values : results) {
    EXPECT_THAT(values, ElementsAreArray(Expected(world_size))) << "W = " << world_size;
  }
}

TEST(GlooCollective, ReducesEachElementWithItsOwnOp) {
  // Powers of two and the sizes where recursive doubling folds extra ranks in and out.
  for (int64_t world_size : {2, 3, 4, 5, 6, 7, 8}) {
    ExpectReduces(world_size, GlooOptions::Algorithm::kRecursiveDoubling);
  }
}

TEST(GlooCollective, GloosOwnAlgorithmsAgree) {
  for (int64_t world_size : {3, 4}) {
    ExpectReduces(world_size, GlooOptions::Algorithm::kBcube);
    ExpectReduces(world_size, GlooOptions::Algorithm::kRing);
  }
}

TEST(GlooCollective, GathersRecordsInRankOrder) {
  InMemoryStore store;
  // Recursive doubling connects only its hypercube partners: the gather runs over them too,
  // folds (W not a power of two) included.
  for (int64_t world_size : {2, 3, 4, 5, 7, 8}) {
    auto group = FormGlooGroup(store, world_size);
    ASSERT_TRUE(group.ok()) << group.status();
    std::vector<int64_t> expected;
    for (int64_t r = 0; r < world_size; ++r) expected.insert(expected.end(), {r, -r, 100 + r});
    auto results = RunRanks<std::vector<int64_t>>(*group, [&](Collective& rank) {
      const std::vector<int64_t> record = {rank.rank(), -rank.rank(), 100 + rank.rank()};
      std::vector<int64_t> out(3 * world_size);
      EXPECT_TRUE(rank.AllGather(record, absl::MakeSpan(out), Soon()).ok());
      return out;
    });
    for (const auto& out : results) EXPECT_THAT(out, ElementsAreArray(expected));
  }
}

TEST(GlooCollective, GloosGatherOverTheFullMesh) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, 3, absl::Seconds(10), Loopback(GlooOptions::Algorithm::kRing));
  ASSERT_TRUE(group.ok()) << group.status();
  auto results = RunRanks<std::vector<int64_t>>(*group, [&](Collective& rank) {
    const std::vector<int64_t> record = {rank.rank() + 5};
    std::vector<int64_t> out(3);
    EXPECT_TRUE(rank.AllGather(record, absl::MakeSpan(out), Soon()).ok());
    return out;
  });
  for (const auto& out : results) EXPECT_THAT(out, ElementsAreArray({5, 6, 7}));
}

// floor(log2 w).
int64_t Log2(int64_t w) {
  int64_t log = 0;
  while ((int64_t{2} << log) <= w) ++log;
  return log;
}

TEST(RecursiveDoublingPeers, SymmetricAndLogarithmic) {
  std::vector<int64_t> sizes;
  for (int64_t w = 1; w <= 130; ++w) sizes.push_back(w);
  sizes.insert(sizes.end(), {1000, 1024, 4097, 10000});
  for (int64_t w : sizes) {
    std::vector<std::vector<int64_t>> peers(w);
    int64_t largest = 0;
    for (int64_t r = 0; r < w; ++r) {
      peers[r] = RecursiveDoublingPeers(r, w);
      largest = std::max<int64_t>(largest, peers[r].size());
      EXPECT_TRUE(std::is_sorted(peers[r].begin(), peers[r].end())) << w << " " << r;
      EXPECT_EQ(std::adjacent_find(peers[r].begin(), peers[r].end()), peers[r].end());
      for (int64_t q : peers[r]) {
        ASSERT_TRUE(q >= 0 && q < w && q != r) << "W = " << w << " rank " << r << " peer " << q;
      }
    }
    for (int64_t r = 0; r < w; ++r) {
      for (int64_t q : peers[r]) {
        EXPECT_TRUE(std::binary_search(peers[q].begin(), peers[q].end(), r))
            << "W = " << w << ": " << r << " -> " << q << " but not back";
      }
    }
    EXPECT_LE(largest, Log2(w) + 1) << "W = " << w;
    // A power of two is a hypercube: exactly log2 W partners each.
    if ((w & (w - 1)) == 0) {
      EXPECT_EQ(largest, Log2(w)) << "W = " << w;
    }
  }
  EXPECT_TRUE(RecursiveDoublingPeers(3, 3).empty());
  EXPECT_TRUE(RecursiveDoublingPeers(-1, 3).empty());
}

// The all-reduce reuses one pair of buffers per partner, alternating by call: a stale or
// overwritten record in any call would change the totals. W = 3 and 5 fold a rank away.
TEST(GlooCollective, ManyCallsInARowStayInStep) {
  for (int64_t world_size : {3, 4, 5}) {
    InMemoryStore store;
    auto group = FormGlooGroup(store, world_size);
    ASSERT_TRUE(group.ok()) << group.status();
    auto totals = RunRanks<int64_t>(*group, [](Collective& rank) {
      int64_t total = 0;
      for (int64_t call = 0; call < 100; ++call) {
        std::vector<int64_t> values = {call * (rank.rank() + 1), call};
        const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMax};
        EXPECT_TRUE(rank.AllReduce(absl::MakeSpan(values), ops, Soon()).ok());
        EXPECT_EQ(values[1], call);
        total += values[0];
      }
      return total;
    });
    const int64_t rank_sum = world_size * (world_size + 1) / 2;
    for (int64_t total : totals) EXPECT_EQ(total, rank_sum * (99 * 100 / 2)) << world_size;
  }
}

// The same with ranks drifting apart between calls (each sleeps a different, varying time before
// each one), so that a fast partner's next record reaches a rank before it has finished the
// previous call: every call must still see exactly its own records.
TEST(GlooCollective, RanksThatDriftApartStillSeeEachCallsOwnRecords) {
  constexpr int64_t kCalls = 60;
  for (int64_t world_size : {3, 4, 5}) {
    InMemoryStore store;
    auto group = FormGlooGroup(store, world_size);
    ASSERT_TRUE(group.ok()) << group.status();
    auto results = RunRanks<std::vector<int64_t>>(*group, [](Collective& rank) {
      std::vector<int64_t> sums;
      for (int64_t call = 0; call < kCalls; ++call) {
        absl::SleepFor(absl::Microseconds(((call * 7 + rank.rank() * 13) % 5) * 150));
        std::vector<int64_t> values = {(call + 1) * (rank.rank() + 1), -call, call};
        const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax};
        EXPECT_TRUE(rank.AllReduce(absl::MakeSpan(values), ops, Soon()).ok());
        EXPECT_EQ(values[1], -call);
        EXPECT_EQ(values[2], call);
        sums.push_back(values[0]);
      }
      return sums;
    });
    const int64_t rank_sum = world_size * (world_size + 1) / 2;
    for (const auto& sums : results) {
      ASSERT_EQ(sums.size(), static_cast<size_t>(kCalls));
      for (int64_t call = 0; call < kCalls; ++call) {
        EXPECT_EQ(sums[call], (call + 1) * rank_sum) << "W = " << world_size << ", call " << call;
      }
    }
  }
}

// Records longer than the preset buffers take Gloo's unbound buffers, in between calls that
// use the preset ones.
TEST(GlooCollective, LongRecordsAndShortOnesInterleave) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, 3);
  ASSERT_TRUE(group.ok()) << group.status();
  auto results = RunRanks<std::vector<int64_t>>(*group, [](Collective& rank) {
    std::vector<int64_t> sums;
    for (int64_t call = 0; call < 6; ++call) {
      const size_t words = call % 2 == 0 ? 100 : 3;
      std::vector<int64_t> values(words, call + rank.rank());
      const std::vector<ReduceOp> ops(words, ReduceOp::kSum);
      EXPECT_TRUE(rank.AllReduce(absl::MakeSpan(values), ops, Soon()).ok());
      for (int64_t v : values) EXPECT_EQ(v, values.front());
      sums.push_back(values.front());
    }
    return sums;
  });
  for (const auto& sums : results) {
    for (int64_t call = 0; call < 6; ++call) EXPECT_EQ(sums[call], 3 * call + (0 + 1 + 2));
  }
}

// The waits of a formed group are bounded by the call's deadline, not by what was left of the
// formation's: a group formed with a short deadline still waits out a peer that is late by more
// than that (GlooOptions::wait_timeout).
TEST(GlooCollective, AWaitIsNotCutShortByTheFormationsDeadline) {
  InMemoryStore store;
  GlooOptions options = Loopback();
  options.wait_timeout = absl::Seconds(10);
  auto group = FormGlooGroup(store, 3, absl::Milliseconds(1500), options);
  ASSERT_TRUE(group.ok()) << group.status();
  const absl::Duration late = absl::Milliseconds(1800);
  auto results = RunRanks<absl::Status>(*group, [&](Collective& rank) {
    if (rank.rank() == 1) absl::SleepFor(late);
    std::vector<int64_t> values = {rank.rank()};
    const std::vector<ReduceOp> ops = {ReduceOp::kMax};
    absl::Status status = rank.AllReduce(absl::MakeSpan(values), ops, Soon());
    EXPECT_EQ(values[0], 2);
    return status;
  });
  for (const absl::Status& status : results) EXPECT_TRUE(status.ok()) << status;
}

TEST(GlooCollective, AMissingRankIsADeadlineWithinTheTimeout) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, 3);
  ASSERT_TRUE(group.ok()) << group.status();
  const absl::Duration timeout = absl::Milliseconds(800);
  auto results = RunRanks<absl::Status>(*group, [&](Collective& rank) {
    if (rank.rank() == 2) return absl::OkStatus();  // never calls
    const absl::Time start = absl::Now();
    std::vector<int64_t> values = {1};
    const std::vector<ReduceOp> ops = {ReduceOp::kMax};
    absl::Status status = rank.AllReduce(absl::MakeSpan(values), ops, start + timeout);
    EXPECT_LT(absl::Now() - start, timeout + absl::Milliseconds(500));
    return status;
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_EQ(results[1].code(), absl::StatusCode::kDeadlineExceeded) << results[1];
  // The instance is spent: a later call fails at once with the same error.
  std::vector<int64_t> values = {1};
  const std::vector<ReduceOp> ops = {ReduceOp::kMax};
  EXPECT_EQ((*group)[0]->AllReduce(absl::MakeSpan(values), ops, Soon()).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(GlooCollective, AbortFailsTheCallerAndThePeerAtOnce) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, 2);
  ASSERT_TRUE(group.ok()) << group.status();
  absl::Status waiting;
  absl::Duration waited;
  std::thread peer([&] {
    const absl::Time start = absl::Now();
    std::vector<int64_t> values = {1};
    const std::vector<ReduceOp> ops = {ReduceOp::kMax};
    waiting = (*group)[0]->AllReduce(absl::MakeSpan(values), ops, start + absl::Seconds(20));
    waited = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(100));
  (*group)[1]->Abort();
  peer.join();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kAborted) << waiting;
  EXPECT_LT(waited, absl::Seconds(5));
  std::vector<int64_t> values = {1};
  const std::vector<ReduceOp> ops = {ReduceOp::kMax};
  const absl::Status after = (*group)[1]->AllReduce(absl::MakeSpan(values), ops, Soon());
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(after.message()), HasSubstr("aborted"));
}

TEST(GlooCollective, AbortWakesItsOwnCallerAtOnce) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, 2);
  ASSERT_TRUE(group.ok()) << group.status();
  absl::Status status;
  absl::Duration waited;
  std::thread caller([&] {
    const absl::Time start = absl::Now();
    std::vector<int64_t> values = {1};
    const std::vector<ReduceOp> ops = {ReduceOp::kMax};
    status = (*group)[0]->AllReduce(absl::MakeSpan(values), ops, start + absl::Seconds(20));
    waited = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(100));
  (*group)[0]->Abort();
  caller.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(waited, absl::Seconds(5));
}

TEST(GlooCollective, APeerThatGoesAwayIsAnAbortNotAHang) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, 3);
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<absl::Status> statuses(2);
  std::vector<absl::Duration> waited(2);
  std::vector<std::thread> survivors;
  for (int r = 0; r < 2; ++r) {
    survivors.emplace_back([&, r] {
      const absl::Time start = absl::Now();
      std::vector<int64_t> values = {1};
      const std::vector<ReduceOp> ops = {ReduceOp::kSum};
      statuses[r] = (*group)[r]->AllReduce(absl::MakeSpan(values), ops, start + absl::Seconds(20));
      waited[r] = absl::Now() - start;
    });
  }
  absl::SleepFor(absl::Milliseconds(100));
  (*group)[2].reset();  // the process of rank 2 is gone
  for (std::thread& t : survivors) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kAborted) << statuses[r];
    EXPECT_LT(waited[r], absl::Seconds(5));
  }
}

TEST(GlooCollective, FormationWithoutARankIsADeadline) {
  InMemoryStore store;
  const std::string prefix = FreshPrefix();
  const absl::Time start = absl::Now();
  // Rank 1 of 2 never shows up.
  auto rank0 =
      GlooCollective::Create(store, prefix, 0, 2, Loopback(), start + absl::Milliseconds(500));
  EXPECT_EQ(rank0.status().code(), absl::StatusCode::kDeadlineExceeded) << rank0.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
}

TEST(GlooCollective, RejectsBadArguments) {
  InMemoryStore store;
  const GlooOptions options = Loopback();
  GlooOptions bad_iface;
  bad_iface.iface = "no-such-interface0";
  EXPECT_EQ(GlooCollective::Create(store, FreshPrefix(), 2, 2, options, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooCollective::Create(store, FreshPrefix(), 0, 0, options, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooCollective::Create(store, FreshPrefix(), 0, 1, bad_iface, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooCollective, AGroupOfOneIsTheIdentity) {
  InMemoryStore store;
  auto group = FormGlooGroup(store, 1);
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<int64_t> values = Values(0);
  ASSERT_TRUE((*group)[0]->AllReduce(absl::MakeSpan(values), kOps, Soon()).ok());
  EXPECT_THAT(values, ElementsAreArray(Values(0)));
}

}  // namespace
}  // namespace packsched::collective
