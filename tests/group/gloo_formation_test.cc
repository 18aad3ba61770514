// Gloo formation when a peer publishes its addresses and then goes away before connecting (a
// process killed between its store write and its connect): formation ends by its deadline,
// whatever Gloo's own connection wait would be, and names that peer; an abort (a shutdown)
// ends it at once, both for GlooCollective::Create and for a StreamGroup forming its collective;
// and a rank whose transport cannot come up is named by its peers with its reason.

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/transport/tcp/address.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/collective/cancellation.h"
#include "server/collective/gloo_collective.h"
#include "server/collective/store.h"
#include "server/group/group.h"
#include "server/group/group_keys.h"
#include "server/group/stream_group.h"
#include "tests/collective/gloo_group.h"

namespace packsched::collective {
namespace {

using group::Group;
using group::GroupOptions;
using group::StreamGroup;
using testing::FreshPrefix;
using ::testing::HasSubstr;
using testing::Loopback;
namespace keys = group::keys;

constexpr absl::Duration kDeadline = absl::Milliseconds(1500);
// Store look-ups naming the rank at fault, and thread scheduling on a loaded machine.
constexpr absl::Duration kMargin = absl::Milliseconds(900);

// What a rank that died after publishing would leave: its addresses for each of its peers, all
// 127.0.0.1:`port`, where nothing listens. Gloo decides which side of a pair connects by comparing
// the two addresses' in-memory port fields: 65535 makes every peer the listening side (it waits
// for a connection that never comes); 256 makes every peer the connecting side (refused at once).
void PublishDeadRank(KeyValueStore& store, const std::string& prefix, int64_t rank,
                     int64_t world_size, uint16_t port) {
  sockaddr_storage storage = {};
  auto* in = reinterpret_cast<sockaddr_in*>(&storage);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::vector<char> address = gloo::transport::tcp::Address(storage).bytes();
  std::string published;
  for (int64_t peer : RecursiveDoublingPeers(rank, world_size)) {
    absl::StrAppend(&published, peer, " ", address.size(), " ",
                    absl::string_view(address.data(), address.size()));
  }
  ASSERT_TRUE(store
                  .Set(absl::StrCat(prefix, "peer_addresses/", rank), published,
                       absl::Now() + absl::Seconds(5))
                  .ok());
}

struct Formed {
  absl::StatusOr<std::unique_ptr<GlooCollective>> collective = absl::UnknownError("not run");
  absl::Duration took;
};

// Ranks 0 .. world_size - 2 form for real, each on its own thread; the last rank is dead.
std::vector<Formed> FormWithDeadLastRank(int64_t world_size, uint16_t dead_port) {
  InMemoryStore store;
  const std::string prefix = FreshPrefix();
  PublishDeadRank(store, prefix, world_size - 1, world_size, dead_port);
  GlooOptions options = Loopback();
  // A long collective timeout: Gloo alone would wait five times (this + 1 s) for the dead peer.
  options.wait_timeout = absl::Seconds(10);
  const absl::Time start = absl::Now();
  std::vector<Formed> formed(world_size - 1);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r + 1 < world_size; ++r) {
    threads.emplace_back([&, r] {
      formed[r].collective =
          GlooCollective::Create(store, prefix, r, world_size, options, start + kDeadline);
      formed[r].took = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  return formed;
}

TEST(GlooFormation, APeerThatNeverConnectsEndsFormationAtItsDeadlineNamingIt) {
  std::vector<Formed> formed = FormWithDeadLastRank(2, /*dead_port=*/65535);
  EXPECT_EQ(formed[0].collective.status().code(), absl::StatusCode::kDeadlineExceeded)
      << formed[0].collective.status();
  EXPECT_THAT(std::string(formed[0].collective.status().message()),
              HasSubstr("ranks [1] published their addresses but did not connect"));
  EXPECT_LT(formed[0].took, kDeadline + kMargin);
}

// Rank 2's partner waits for it to connect; the rank waiting for that partner in the barrier
// learns from the store whom to name, so both report the same rank.
TEST(GlooFormation, EveryRankNamesThePeerThatNeverConnected) {
  std::vector<Formed> formed = FormWithDeadLastRank(3, /*dead_port=*/65535);
  for (int64_t r : {0, 1}) {
    EXPECT_EQ(formed[r].collective.status().code(), absl::StatusCode::kDeadlineExceeded)
        << "rank " << r << ": " << formed[r].collective.status();
    EXPECT_THAT(std::string(formed[r].collective.status().message()), HasSubstr("ranks [2]"))
        << "rank " << r;
    EXPECT_LT(formed[r].took, kDeadline + kMargin) << "rank " << r;
  }
}

// Its listening socket is gone: that is a peer that went away (Aborted), not a slow one, and
// known at once.
TEST(GlooFormation, APeerThatWentAwayIsAbortedNamingItBeforeTheDeadline) {
  std::vector<Formed> formed = FormWithDeadLastRank(3, /*dead_port=*/256);
  for (int64_t r : {0, 1}) {
    EXPECT_EQ(formed[r].collective.status().code(), absl::StatusCode::kAborted)
        << "rank " << r << ": " << formed[r].collective.status();
    EXPECT_THAT(std::string(formed[r].collective.status().message()),
                HasSubstr("ranks [2] published their addresses and then could not be reached"))
        << "rank " << r;
    EXPECT_LT(formed[r].took, kDeadline) << "rank " << r;
  }
}

// How long after an abort formation must have ended (it ends in milliseconds; the rest is
// scheduling on a loaded machine). The deadlines below are far beyond it.
constexpr absl::Duration kPrompt = absl::Milliseconds(500);
constexpr absl::Duration kLongDeadline = absl::Seconds(5);

// Regression: a cancel during formation (what StreamGroup::Abort sends at shutdown) used to
// leave the rank waiting for its dead partner until the deadline.
TEST(GlooFormation, ACancelEndsFormationAtOnceWithAborted) {
  InMemoryStore store;
  const std::string prefix = FreshPrefix();
  PublishDeadRank(store, prefix, 1, 2, /*dead_port=*/65535);  // rank 0 waits for it to connect
  GlooOptions options = Loopback();
  options.wait_timeout = absl::Seconds(10);
  Cancellation cancel;
  absl::Time cancelled_at;
  std::thread canceller([&] {
    // Rank 0 has published its own addresses: it is connecting (its store calls are done).
    ASSERT_TRUE(
        store.Get(absl::StrCat(prefix, "peer_addresses/0"), absl::Now() + kLongDeadline).ok());
    absl::SleepFor(absl::Milliseconds(100));
    cancelled_at = absl::Now();
    cancel.Cancel();
  });
  const absl::Time start = absl::Now();
  auto formed =
      GlooCollective::Create(store, prefix, 0, 2, options, start + kLongDeadline, &cancel);
  const absl::Time ended = absl::Now();
  canceller.join();
  EXPECT_EQ(formed.status().code(), absl::StatusCode::kAborted) << formed.status();
  EXPECT_THAT(std::string(formed.status().message()), HasSubstr("cancelled"));
  EXPECT_LT(ended - cancelled_at, kPrompt) << "formation took " << ended - start;

  // Cancelled before it starts: nothing is published.
  const std::string unused = FreshPrefix();
  EXPECT_EQ(
      GlooCollective::Create(store, unused, 0, 2, options, absl::Now() + kLongDeadline, &cancel)
          .status()
          .code(),
      absl::StatusCode::kAborted);
  EXPECT_FALSE(store.TryGet(absl::StrCat(unused, "peer_addresses/0"), absl::Now() + kLongDeadline)
                   ->has_value());
}

// Rank 0 of a two-rank Gloo group whose rank 1 the test plays (or leaves out).
GroupOptions RankZeroOfTwo() {
  GroupOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.backend = Backend::kGloo;
  options.collective_timeout = kLongDeadline;
  options.gloo = Loopback();
  return options;
}

// Regression: StreamGroup::Abort() during a formation (a shutdown) used to leave the stream's
// worker in it until --collective_timeout; it is Aborted at once, and the generation it was
// forming is ended, so the peers form the next one.
TEST(GlooFormation, AStreamGroupAbortedWhileFormingFailsAtOnceAndEndsTheGeneration) {
  InMemoryStore store;
  const GroupOptions options = RankZeroOfTwo();
  auto group = Group::Create(&store, options);
  ASSERT_TRUE(group.ok()) << group.status();
  std::unique_ptr<StreamGroup> stream = (*group)->ForStream("actor");

  absl::Status status;
  absl::Time ended;
  std::thread forming([&] {
    status = stream->Form();
    ended = absl::Now();
  });
  // Rank 1 joined generation 0, published its addresses and stopped before connecting.
  const absl::Time soon = absl::Now() + kLongDeadline;
  absl::StatusOr<std::string> epoch = store.Get(keys::Epoch(options.key_root), soon);
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  const std::string formation = keys::Formation(
      keys::StreamRoot(keys::EpochRoot(options.key_root, *epoch), "actor"), /*generation=*/0);
  const std::string prefix = absl::StrCat(formation, "gloo/");
  ASSERT_TRUE(store.Set(keys::Joined(formation, 1), "1", soon).ok());
  PublishDeadRank(store, prefix, 1, 2, /*dead_port=*/65535);
  ASSERT_TRUE(store.Get(absl::StrCat(prefix, "peer_addresses/0"), soon).ok());
  absl::SleepFor(absl::Milliseconds(100));  // rank 0 is waiting for rank 1 to connect

  const absl::Time aborted_at = absl::Now();
  stream->Abort();
  forming.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("generation 0 was aborted"));
  EXPECT_LT(ended - aborted_at, kPrompt);
  EXPECT_FALSE(stream->info().formed);
  EXPECT_EQ(*store.TryGet(keys::Ended(formation), soon), "formation");
  EXPECT_EQ(*store.TryGet(keys::Generation(
                              keys::StreamRoot(keys::EpochRoot(options.key_root, *epoch), "actor")),
                          soon),
            "1");
}

// Regression (found in review): an Abort() that came before the formation started (a shutdown
// reaching a worker still planning its local half) was lost, and the formation then waited for
// a peer that never connected until --collective_timeout. It fails at once and joins nothing.
TEST(GlooFormation, AnAbortBeforeFormationStartsIsNotLost) {
  InMemoryStore store;
  const GroupOptions options = RankZeroOfTwo();
  auto group = Group::Create(&store, options);
  ASSERT_TRUE(group.ok()) << group.status();
  std::unique_ptr<StreamGroup> stream = (*group)->ForStream("actor");
  stream->Abort();
  const absl::Time start = absl::Now();
  const absl::Status status = stream->Form();
  EXPECT_LT(absl::Now() - start, kPrompt) << status;
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("shutting down"));
  EXPECT_FALSE(stream->info().formed);
}

// A rank whose own transport cannot come up (an interface it cannot bind: an operator's typo)
// tells its peers why: they fail by their deadline naming it and its reason, not only that it
// did not connect.
TEST(GlooFormation, ARankThatCannotBringUpItsTransportNamesItsReasonToItsPeers) {
  constexpr int64_t kWorld = 3;
  constexpr int64_t kBroken = 2;
  InMemoryStore store;
  std::vector<std::unique_ptr<Group>> groups;
  for (int64_t r = 0; r < kWorld; ++r) {
    GroupOptions options;
    options.rank = r;
    options.world_size = kWorld;
    options.backend = Backend::kGloo;
    options.collective_timeout = kDeadline;
    options.gloo = Loopback();
    if (r == kBroken) {
      options.gloo.hostname.clear();
      options.gloo.iface = "psnoiface9";
    }
    auto group = Group::Create(&store, options);
    ASSERT_TRUE(group.ok()) << group.status();
    groups.push_back(std::move(group).value());
  }
  std::vector<std::unique_ptr<StreamGroup>> streams;
  for (auto& group : groups) streams.push_back(group->ForStream("actor"));
  std::vector<absl::Status> status(kWorld);
  std::vector<absl::Duration> took(kWorld);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      status[r] = streams[r]->Form();
      took[r] = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();

  EXPECT_EQ(status[kBroken].code(), absl::StatusCode::kInvalidArgument) << status[kBroken];
  EXPECT_THAT(std::string(status[kBroken].message()), HasSubstr("psnoiface9"));
  for (int64_t r = 0; r < kWorld; ++r) {
    if (r == kBroken) continue;
    EXPECT_FALSE(status[r].ok()) << "rank " << r;
    EXPECT_THAT(std::string(status[r].message()),
                HasSubstr("rank 2 not ready: gloo: no network interface named 'psnoiface9'"))
        << "rank " << r << ": " << status[r];
    EXPECT_LT(took[r], kDeadline + kMargin) << "rank " << r;
  }
}

}  // namespace
}  // namespace packsched::collective
