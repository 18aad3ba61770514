// The cost of a micro-batch planned for a sliding-window model against the scores the kernels'
// own window computes (kernels/common/attention_tile.h): the planner's windowed term
// (server/planner/options.h, AttentionCost) counts, per sequence, 2 x the (query, key) pairs the
// kernel visits minus the queries.

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/attention_tile.h"
#include "server/planner/model_cost.h"
#include "server/planner/options.h"
#include "server/planner/planner.h"

namespace packsched::planner {
namespace {

using Ints = absl::flat_hash_map<std::string, int64_t>;
using Strings = absl::flat_hash_map<std::string, std::string>;

// The kernels' own window (kernels/common/attention_tile.h, a left window of w - 1 as
// transformers' window w) sees, summed over a micro-batch's sequences, the scores the planner
// costs that micro-batch for.
TEST(PlanWindowCost, AMicroBatchCostsWhatTheKernelsWindowComputes) {
  const Ints mistral = {{"hidden_size", 4096},       {"intermediate_size", 14336},
                        {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                        {"num_hidden_layers", 32},   {"vocab_size", 32000},
                        {"sliding_window", 4096}};
  const Strings strings = {{"model_type", "mistral"}};
  const std::vector<int64_t> lengths = {4095, 4096, 4097, 9000, 123, 30000};
  PlanOptions o;
  o.max_token_len = 1 << 20;
  o.order = PartOrder::kIndex;
  ASSERT_TRUE(UseModelCost(mistral, strings, lengths, o).ok());
  ASSERT_GT(o.attention.windowed, 0);
  const absl::StatusOr<MicroBatchPlan> plan = PartitionFixedK(lengths, 1, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t kernel_cost = 0;
  for (int64_t length : lengths) {
    const kernels::AttnMask mask{length,
                                 length,
                                 /*causal=*/true,
                                 /*window_left=*/o.attention.window - 1,
                                 /*window_right=*/-1,
                                 kernels::AttnTree{}};
    int64_t pairs = 0;
    for (int64_t i = 0; i < length; ++i) {
      const kernels::KeyRange keys = kernels::VisibleKeys(mask, i);
      pairs += keys.hi - keys.lo;
    }
    kernel_cost += o.attention.linear * length + o.attention.windowed * (2 * pairs - length);
  }
  EXPECT_EQ(plan->parts[0].cost, kernel_cost);
}

}  // namespace
}  // namespace packsched::planner
