#ifndef PACKSCHED_SERVER_BASE_CHECKED_MATH_H_
#define PACKSCHED_SERVER_BASE_CHECKED_MATH_H_

// Overflow-checked int64 arithmetic. The planner decides only with integers, so every build
// and every rank decides identically; these helpers make overflow an explicit, testable case
// (std::nullopt) instead of undefined behaviour.

#include <cstdint>
#include <optional>

namespace packsched {

// Returns a + b, or nullopt if the result does not fit in int64.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// Returns a * b, or nullopt if the result does not fit in int64.
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// Returns ceil(a / b) for a >= 0, b > 0.
constexpr int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// Returns the smallest multiple of `m` that is >= a, or nullopt on overflow.
// REQUIRES: a >= 0, m >= 1.
inline std::optional<int64_t> CheckedRoundUp(int64_t a, int64_t m) {
  const int64_t rem = a % m;
  if (rem == 0) return a;
  return CheckedAdd(a, m - rem);
}

// Returns the largest multiple of `m` that is <= a. REQUIRES: a >= 0, m >= 1.
constexpr int64_t RoundDown(int64_t a, int64_t m) { return a - a % m; }

}  // namespace packsched

#endif  // PACKSCHED_SERVER_BASE_CHECKED_MATH_H_
