#ifndef PACKSCHED_TESTS_COLLECTIVE_RUN_RANKS_H_
#define PACKSCHED_TESTS_COLLECTIVE_RUN_RANKS_H_

// Runs one function per rank of a group, each on its own thread, and returns their results in
// rank order: the gloo-test style of exercising N ranks inside one process.

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "server/collective/collective.h"

namespace packsched::collective::testing {

template <typename Result>
std::vector<Result> RunRanks(std::vector<std::unique_ptr<Collective>>& group,
                             const std::function<Result(Collective&)>& body) {
  std::vector<Result> results(group.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = body(*group[r]); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace packsched::collective::testing

#endif  // PACKSCHED_TESTS_COLLECTIVE_RUN_RANKS_H_
