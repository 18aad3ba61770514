#ifndef PACKSCHED_TESTS_TESTING_SOAK_H_
#define PACKSCHED_TESTS_TESTING_SOAK_H_

// Longer randomised runs on demand, for the seeded property and fuzz tests:
//   PACKSCHED_SOAK_SEED=S   every seeded driver starts S seeds further on (default 0);
//   PACKSCHED_SOAK_SCALE=M  every driver runs M times its trials (default 1).
// The test command uses the defaults; a soak is e.g.
//   PACKSCHED_SOAK_SEED=1000000 PACKSCHED_SOAK_SCALE=20 build-asan/bin/planner_fuzz_test
// A failure message names the seed or trial, so a soak's finding reruns alone.

#include <cstdint>
#include <cstdlib>
#include <string>

namespace packsched::testing {

namespace internal {
// The variable as a non-negative integer, or `otherwise` if unset or not one.
inline uint64_t EnvCount(const char* name, uint64_t otherwise) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return otherwise;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  return *end == '\0' && text[0] != '-' ? value : otherwise;
}
}  // namespace internal

// Added to every seed a randomised driver uses.
inline uint64_t SoakSeed() { return internal::EnvCount("PACKSCHED_SOAK_SEED", 0); }

// `trials` times PACKSCHED_SOAK_SCALE (at least 1).
inline int64_t SoakTrials(int64_t trials) {
  const uint64_t scale = internal::EnvCount("PACKSCHED_SOAK_SCALE", 1);
  return trials * static_cast<int64_t>(scale < 1 ? 1 : scale);
}

}  // namespace packsched::testing

#endif  // PACKSCHED_TESTS_TESTING_SOAK_H_
