#include "server/base/checked_math.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace packsched {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(CheckedAdd, SumsInRange) {
  EXPECT_EQ(CheckedAdd(2, 3), 5);
  EXPECT_EQ(CheckedAdd(kMax - 1, 1), kMax);
  EXPECT_EQ(CheckedAdd(-5, 2), -3);
}

TEST(CheckedAdd, OverflowIsNullopt) {
  EXPECT_EQ(CheckedAdd(kMax, 1), std::nullopt);
  EXPECT_EQ(CheckedAdd(kMin, -1), std::nullopt);
}

TEST(CheckedMul, ProductsInRangeAndOverflow) {
  EXPECT_EQ(CheckedMul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_EQ(CheckedMul(int64_t{1} << 32, int64_t{1} << 31), std::nullopt);
  EXPECT_EQ(CheckedMul(-3, 4), -12);
}

TEST(CeilDiv, RoundsUp) {
  EXPECT_EQ(CeilDiv(0, 7), 0);
  EXPECT_EQ(CeilDiv(7, 7), 1);
  EXPECT_EQ(CeilDiv(8, 7), 2);
  EXPECT_EQ(CeilDiv(kMax, 1), kMax);
}

TEST(RoundUp, ToMultiples) {
  EXPECT_EQ(CheckedRoundUp(0, 8), 0);
  EXPECT_EQ(CheckedRoundUp(1, 8), 8);
  EXPECT_EQ(CheckedRoundUp(16, 8), 16);
  EXPECT_EQ(CheckedRoundUp(kMax - 1, 4), std::nullopt);
  EXPECT_EQ(RoundDown(17, 8), 16);
  EXPECT_EQ(RoundDown(7, 8), 0);
}

}  // namespace
}  // namespace packsched
