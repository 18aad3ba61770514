#ifndef PACKSCHED_TESTS_TESTING_LENGTHS_H_
#define PACKSCHED_TESTS_TESTING_LENGTHS_H_

// Test and benchmark inputs: sequence lengths shaped like real training batches.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace packsched::testing {

// A realistic RL mix: prompt 200-2,000 plus response 50-16,000 tokens, each lognormal (medians
// 600 and 1,500) and clamped to its range. Deterministic for a seed on a given standard library.
inline std::vector<int64_t> RealisticRlLengths(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> prompt(std::log(600.0), 0.6);
  std::lognormal_distribution<double> response(std::log(1500.0), 1.0);
  std::vector<int64_t> lengths(n);
  for (int64_t& length : lengths) {
    const double p = std::clamp(prompt(rng), 200.0, 2000.0);
    const double r = std::clamp(response(rng), 50.0, 16000.0);
    length = static_cast<int64_t>(p) + static_cast<int64_t>(r);
  }
  return lengths;
}

// Uniform lengths in [lo, hi].
inline std::vector<int64_t> UniformLengths(int64_t n, int64_t lo, int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  std::vector<int64_t> lengths(n);
  for (int64_t& length : lengths) length = dist(rng);
  return lengths;
}

}  // namespace packsched::testing

#endif  // PACKSCHED_TESTS_TESTING_LENGTHS_H_
