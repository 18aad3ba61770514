// Gloo formation when a peer publishes its addresses and then goes away before connecting (a
// process killed between its store write and its connect): formation ends by its deadline,
// whatever Gloo's own connection wait would be, and names that peer.

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
#include "server/collective/gloo_collective.h"
#include "server/collective/store.h"
#include "tests/collective/gloo_group.h"

namespace packsched::collective {
namespace {

using testing::FreshPrefix;
using ::testing::HasSubstr;
using testing::Loopback;

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

}  // namespace
}  // namespace packsched::collective
