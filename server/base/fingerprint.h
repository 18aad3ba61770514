#ifndef PACKSCHED_SERVER_BASE_FINGERPRINT_H_
#define PACKSCHED_SERVER_BASE_FINGERPRINT_H_

// Stable 64-bit fingerprints: the same bytes give the same value in every process, build and
// machine (unlike absl::Hash, which is seeded per process). Ranks compare them to detect that
// they disagree on a stream name or on options; not for security.

#include <cstdint>

#include "absl/strings/string_view.h"

namespace packsched {

// FNV-1a over `bytes`, continuing from `seed` (chain calls to fingerprint several fields).
constexpr uint64_t kFingerprintSeed = 0xcbf29ce484222325ULL;
constexpr uint64_t Fingerprint64(absl::string_view bytes, uint64_t seed = kFingerprintSeed) {
  uint64_t h = seed;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Folds one integer (its 8 little-endian bytes) into a fingerprint.
constexpr uint64_t Fingerprint64(int64_t value, uint64_t seed) {
  uint64_t h = seed;
  uint64_t v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace packsched

#endif  // PACKSCHED_SERVER_BASE_FINGERPRINT_H_
