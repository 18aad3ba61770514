// The CPU backend of the context-parallel kernels and 3-D positions: shards against their
// definition (chunk c and chunk 2cp-1-c of every sequence), the round trip, validation, and 3-D
// positions worked out by hand from the published rule (Qwen2-VL, HF get_rope_index).

#include "packsched/kernels/context_parallel.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels {
namespace {

using testing::CuTensor;
using testing::HostTensor;

std::vector<int64_t> RankRows(const std::vector<int32_t>& cu, int64_t cp, int64_t rank) {
  std::vector<int64_t> rows;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t m = (cu[b + 1] - cu[b]) / (2 * cp);
    for (int64_t c : {rank, 2 * cp - 1 - rank}) {
      for (int64_t i = 0; i < m; ++i) rows.push_back(cu[b] + c * m + i);
    }
  }
  return rows;
}

TEST(CpShardTest, ShardsAreTheHeadAndTailChunksAndUnshardRebuildsX) {
  for (int64_t cp : {1, 2, 3, 4}) {
    const std::vector<int32_t> cu = {0, static_cast<int32_t>(2 * cp), static_cast<int32_t>(2 * cp),
                                     static_cast<int32_t>(8 * cp), static_cast<int32_t>(14 * cp)};
    const int64_t total = cu.back();
    std::vector<int64_t> values(total * 3);
    std::iota(values.begin(), values.end(), 1000);
    HostTensor x = HostTensor::Of<int64_t>({total, 3}, values);
    HostTensor cu_t = CuTensor(cu);
    HostTensor rebuilt = HostTensor::Zeros<int64_t>({total, 3});
    for (int64_t rank = 0; rank < cp; ++rank) {
      HostTensor shard = HostTensor::Zeros<int64_t>({total / cp, 3});
      ASSERT_TRUE(CpShard(x.view(), {&cu_t.view(), {}}, cp, rank, shard.view(), nullptr).ok());
      const std::vector<int64_t> rows = RankRows(cu, cp, rank);
      const std::vector<int64_t> got = shard.values<int64_t>();
      ASSERT_EQ(static_cast<int64_t>(rows.size()), total / cp);
      for (size_t r = 0; r < rows.size(); ++r) {
        for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(got[r * 3 + j], values[rows[r] * 3 + j]);
      }
      ASSERT_TRUE(
          CpUnshard(shard.view(), {&cu_t.view(), {}}, cp, rank, rebuilt.view(), nullptr).ok());
    }
    EXPECT_EQ(rebuilt.values<int64_t>(), values) << "cp=" << cp;
  }
}

TEST(CpShardTest, RejectsMisalignedLengthsBadRanksAndShapes) {
  HostTensor x = HostTensor::Zeros<float>({12});
  HostTensor shard = HostTensor::Zeros<float>({6});
  HostTensor cu = CuTensor({0, 4, 12});
  HostTensor odd = CuTensor({0, 6, 12});
  EXPECT_EQ(CpShard(x.view(), {&odd.view(), {}}, 2, 0, shard.view(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CpShard(x.view(), {&cu.view(), {}}, 2, 2, shard.view(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CpShard(x.view(), {&cu.view(), {}}, 0, 0, shard.view(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  HostTensor wrong = HostTensor::Zeros<float>({5});
  EXPECT_EQ(CpShard(x.view(), {&cu.view(), {}}, 2, 0, wrong.view(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  HostTensor doubles = HostTensor::Zeros<double>({6});
  EXPECT_EQ(CpUnshard(doubles.view(), {&cu.view(), {}}, 2, 0, x.view(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MropeTest, ImageBetweenTextAndATail) {
  // Sequence 0: 2 text, an image grid (1, 4, 6) with merge 2 = 1 x 2 x 3 tokens, 2 text.
  // By the rule: text 0, 1; the image at 2: t = 2, h = 2 + (k / 3) % 2, w = 2 + k % 3; the text
  // after it starts at 2 + max(1, 2, 3) = 5. Sequence 1: 3 text tokens: 0, 1, 2. Tail: 0, 1.
  const std::vector<int32_t> types = {0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  HostTensor types_t = HostTensor::Of<int32_t>({15}, types);
  HostTensor cu = CuTensor({0, 10, 13});
  HostTensor grids = HostTensor::Of<int32_t>({1, 3}, {1, 4, 6});
  HostTensor grid_cu = CuTensor({0, 1, 1});
  HostTensor pos = HostTensor::Zeros<int64_t>({3, 15});
  ASSERT_TRUE(MropePositionIds(types_t.view(), {&cu.view(), {}, 15}, grids.view(),
                               {&grid_cu.view(), {}}, 2, pos.view(), nullptr)
                  .ok());
  const std::vector<int64_t> expected = {
      0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 0, 1, 2, 0, 1,  // temporal
      0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 0, 1, 2, 0, 1,  // height
      0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 0, 1, 2, 0, 1,  // width
  };
  EXPECT_EQ(pos.values<int64_t>(), expected);
}

TEST(MropeTest, RejectsGridsThatDisagreeWithTheTypes) {
  HostTensor types = HostTensor::Of<int32_t>({4}, {0, 1, 1, 0});
  HostTensor cu = CuTensor({0, 4});
  HostTensor pos = HostTensor::Zeros<int64_t>({3, 4});
  HostTensor grids = HostTensor::Of<int32_t>({1, 3}, {1, 2, 6});  // 3 tokens, covers a text one
  HostTensor grid_cu = CuTensor({0, 1});
  EXPECT_EQ(MropePositionIds(types.view(), {&cu.view(), {}}, grids.view(), {&grid_cu.view(), {}}, 2,
                             pos.view(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pos.values<int64_t>(), std::vector<int64_t>(12, 0)) << "nothing written";
  HostTensor short_cu = CuTensor({0, 0});
  EXPECT_EQ(MropePositionIds(types.view(), {&cu.view(), {}}, grids.view(), {&short_cu.view(), {}},
                             2, pos.view(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace packsched::kernels
