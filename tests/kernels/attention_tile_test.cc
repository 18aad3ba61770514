// The per-tile mask arithmetic shared by both backends (kernels/common/attention_tile.h):
// VisibleKeys against the definition in attention.h, for windows up to INT64_MAX.

#include "kernels/common/attention_tile.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace packsched::kernels {
namespace {

// The definition, evaluated in __int128 so that no window can overflow it.
bool Visible(const AttnMask& m, int64_t i, int64_t j) {
  const __int128 diag = static_cast<__int128>(i) + m.sk - m.sq;
  if (m.causal && j > diag) return false;
  if (m.window_left >= 0 && j < diag - m.window_left) return false;
  if (m.window_right >= 0 && j > diag + m.window_right) return false;
  return true;
}

TEST(VisibleKeysTest, MatchesTheDefinitionForWindowsUpToInt64Max) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t windows[] = {-1,       0,   1, 2, 5, int64_t{1} << 30, INT32_MAX, int64_t{1} << 62,
                             kMax - 1, kMax};
  for (int64_t sq : {0, 1, 3, 7}) {
    for (int64_t sk : {0, 1, 3, 7}) {
      for (bool causal : {false, true}) {
        for (int64_t left : windows) {
          for (int64_t right : windows) {
            const AttnMask m{sq, sk, causal, left, right, AttnTree{}};
            for (int64_t i = 0; i <= sq; ++i) {  // i == sq is a pad slot
              SCOPED_TRACE(::testing::Message()
                           << "sq=" << sq << " sk=" << sk << " causal=" << causal << " window=("
                           << left << ", " << right << ") i=" << i);
              int64_t lo = -1, hi = -1;
              for (int64_t j = 0; j < sk && i < sq; ++j) {
                if (!Visible(m, i, j)) continue;
                if (lo < 0) lo = j;
                hi = j + 1;
              }
              const KeyRange r = VisibleKeys(m, i);
              if (lo < 0) {
                EXPECT_GE(r.lo, r.hi);  // empty
              } else {
                EXPECT_EQ(r.lo, lo);
                EXPECT_EQ(r.hi, hi);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace packsched::kernels
