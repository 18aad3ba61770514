#ifndef PACKSCHED_TESTS_COLLECTIVE_GLOO_GROUP_H_
#define PACKSCHED_TESTS_COLLECTIVE_GLOO_GROUP_H_

// Forms a Gloo group of threads on 127.0.0.1 through an InMemoryStore, the way separate
// processes would through the rendezvous store: every rank calls GlooCollective::Create at once
// on its own thread.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/collective/gloo_collective.h"
#include "server/collective/store.h"
#include "tests/testing/ignore_sigpipe.h"

namespace packsched::collective::testing {

// Gloo on loopback, with the given algorithm.
inline GlooOptions Loopback(
    GlooOptions::Algorithm algorithm = GlooOptions::Algorithm::kRecursiveDoubling) {
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.algorithm = algorithm;
  return options;
}

// A prefix no other formation in this process has used.
inline std::string FreshPrefix() {
  static std::atomic<int> next{0};
  return absl::StrCat("test/", next++, "/");
}

// Returns the ranks in rank order, or the first rank's error.
inline absl::StatusOr<std::vector<std::unique_ptr<Collective>>> FormGlooGroup(
    KeyValueStore& store, int64_t world_size, absl::Duration timeout = absl::Seconds(10),
    GlooOptions options = Loopback()) {
  const std::string prefix = FreshPrefix();
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<absl::StatusOr<std::unique_ptr<GlooCollective>>> formed(world_size);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      formed[r] = GlooCollective::Create(store, prefix, r, world_size, options, deadline);
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<Collective>> group;
  for (auto& rank : formed) {
    if (!rank.ok()) return rank.status();
    group.push_back(std::move(rank).value());
  }
  return group;
}

}  // namespace packsched::collective::testing

#endif  // PACKSCHED_TESTS_COLLECTIVE_GLOO_GROUP_H_
