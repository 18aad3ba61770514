// The server's security helpers: the constant-time token comparison (which addresses count as
// loopback: tests/base/address_test.cc).

#include "gtest/gtest.h"
#include "server/service/server.h"

namespace packsched::service {
namespace {

TEST(ConstantTimeEquals, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(CheckBearerToken, AcceptsOnlyTheServersTokenInTheBearerScheme) {
  EXPECT_TRUE(CheckBearerToken(std::nullopt, "").ok());  // no token configured: every call passes
  EXPECT_TRUE(CheckBearerToken("Bearer s3cret", "s3cret").ok());
  EXPECT_EQ(CheckBearerToken(std::nullopt, "s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("Bearer wrong", "s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("Basic s3cret", "s3cret").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("Bearer s3cret2", "s3cret").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckBearerToken("", "s3cret").code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace packsched::service
