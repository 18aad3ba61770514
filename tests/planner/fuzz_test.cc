// A seeded random driver over the planner's whole input space, extreme values included: every
// call either returns a consistent plan or InvalidArgument — never a crash, hang or other code.
// Run under -DPACKSCHED_SANITIZE=address,undefined to catch overflow and memory errors too.

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "tests/planner/plan_checks.h"
#include "tests/testing/soak.h"

namespace packsched::planner {
namespace {

int64_t Extreme(std::mt19937_64& rng) {
  static const int64_t kValues[] = {std::numeric_limits<int64_t>::min(),
                                    -1,
                                    0,
                                    1,
                                    2,
                                    3,
                                    7,
                                    64,
                                    1000,
                                    16384,
                                    kMaxLength,
                                    kMaxLength + 1,
                                    std::numeric_limits<int64_t>::max()};
  if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
    return kValues[std::uniform_int_distribution<size_t>(0, std::size(kValues) - 1)(rng)];
  }
  return std::uniform_int_distribution<int64_t>(-5, 5000)(rng);
}

TEST(PlannerFuzz, AnyInputGivesAValidPlanOrInvalidArgument) {
  std::mt19937_64 rng(2024 + packsched::testing::SoakSeed());
  int ok = 0;
  const int64_t trials = packsched::testing::SoakTrials(20000);
  for (int64_t trial = 0; trial < trials; ++trial) {
    std::vector<int64_t> lengths(std::uniform_int_distribution<int>(0, 40)(rng));
    for (int64_t& l : lengths) {
      l = std::uniform_int_distribution<int>(0, 9)(rng) == 0
              ? Extreme(rng)
              : std::uniform_int_distribution<int64_t>(1, 3000)(rng);
    }
    PlanOptions o;
    o.max_token_len = std::uniform_int_distribution<int>(0, 1)(rng) ? Extreme(rng) : 4096;
    o.cap_mode = static_cast<CapMode>(std::uniform_int_distribution<int>(0, 2)(rng));
    o.max_seqs_per_micro_batch = std::uniform_int_distribution<int>(0, 3)(rng) ? 0 : Extreme(rng);
    o.min_micro_batches = std::uniform_int_distribution<int>(0, 3)(rng) ? 1 : Extreme(rng);
    o.divisible_by = std::uniform_int_distribution<int>(0, 3)(rng) ? 1 : Extreme(rng);
    o.align_to = std::uniform_int_distribution<int>(0, 3)(rng) ? 1 : Extreme(rng);
    o.align_total_to = std::uniform_int_distribution<int>(0, 3)(rng) ? 1 : Extreme(rng);
    o.algorithm = static_cast<Algorithm>(std::uniform_int_distribution<int>(0, 5)(rng));
    o.cost = static_cast<CostModel>(std::uniform_int_distribution<int>(0, 2)(rng));
    o.attention = {Extreme(rng), Extreme(rng)};
    o.overlong = static_cast<OverlongPolicy>(std::uniform_int_distribution<int>(0, 3)(rng));
    o.order = static_cast<PartOrder>(std::uniform_int_distribution<int>(0, 3)(rng));
    o.max_micro_batches = std::uniform_int_distribution<int>(0, 3)(rng) ? 100000 : Extreme(rng);
    o.equal_size = std::uniform_int_distribution<int>(0, 9)(rng) == 0;
    const int64_t k = Extreme(rng);

    const bool packer = o.algorithm == Algorithm::kFirstFitDecreasing ||
                        o.algorithm == Algorithm::kBestFitDecreasing ||
                        o.algorithm == Algorithm::kSequential;
    const absl::StatusOr<MicroBatchPlan> plan =
        packer ? PackDataset(lengths, o)
               : (std::uniform_int_distribution<int>(0, 1)(rng) ? PlanMicroBatches(lengths, o)
                                                                : PartitionFixedK(lengths, k, o));
    if (!plan.ok()) {
      ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument)
          << "trial " << trial << ": " << plan.status();
      continue;
    }
    ++ok;
    ASSERT_EQ(testing::CheckPlan(lengths, o, *plan, !o.equal_size), "") << "trial " << trial;
  }
  EXPECT_GT(ok, 1000);  // the driver reaches the planning code, not only validation
}

}  // namespace
}  // namespace packsched::planner
