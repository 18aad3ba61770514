#ifndef PACKSCHED_TESTS_KERNELS_RECURRENT_ROWS_H_
#define PACKSCHED_TESTS_KERNELS_RECURRENT_ROWS_H_

// Inputs of the recurrent kernels' C++ tests: a packed row of two trees as prev_row, and seeded
// uniform values.

#include <cstdint>
#include <random>
#include <vector>

namespace packsched::kernels::testing {

// 20 rows: root [0, 4) with children [4, 7) (its children [7, 9) and [9, 11)) and [11, 14); a
// second root [14, 18) (a sequence start) with one child [18, 20). prev_row: t - 1 inside a node,
// the parent's last row at a node's first row, -1 at a root.
inline std::vector<int32_t> TwoTreeRows() {
  const int begin[] = {0, 4, 7, 9, 11, 14, 18};
  const int end[] = {4, 7, 9, 11, 14, 18, 20};
  const int parent[] = {-1, 0, 1, 1, 0, -1, 5};
  std::vector<int32_t> prev(20);
  for (int n = 0; n < 7; ++n) {
    for (int t = begin[n]; t < end[n]; ++t) prev[t] = t - 1;
    prev[begin[n]] = parent[n] < 0 ? -1 : end[parent[n]] - 1;
  }
  return prev;
}

inline std::vector<double> UniformValues(int64_t n, uint32_t seed, double lo, double hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

}  // namespace packsched::kernels::testing

#endif  // PACKSCHED_TESTS_KERNELS_RECURRENT_ROWS_H_
