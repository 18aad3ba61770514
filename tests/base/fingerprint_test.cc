#include "server/base/fingerprint.h"

#include "gtest/gtest.h"

namespace packsched {
namespace {

// Published FNV-1a 64-bit test vectors (Fowler/Noll/Vo reference test suite).
TEST(Fingerprint64, MatchesTheFnv1aReferenceVectors) {
  EXPECT_EQ(Fingerprint64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fingerprint64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fingerprint64("foobar"), 0x85944171f73967e8ULL);
}

TEST(Fingerprint64, ChainsAndDistinguishesFields) {
  EXPECT_EQ(Fingerprint64("bar", Fingerprint64("foo")), Fingerprint64("foobar"));
  EXPECT_NE(Fingerprint64(int64_t{1}, kFingerprintSeed),
            Fingerprint64(int64_t{2}, kFingerprintSeed));
  // Integers fold their little-endian bytes: 0x61 ('a') then seven zero bytes.
  EXPECT_EQ(Fingerprint64(int64_t{0x61}, kFingerprintSeed),
            Fingerprint64(absl::string_view("a\0\0\0\0\0\0\0", 8)));
}

TEST(Fingerprint64, IsAConstantExpression) {
  static_assert(Fingerprint64("a") == 0xaf63dc4c8601ec8cULL);
}

}  // namespace
}  // namespace packsched
