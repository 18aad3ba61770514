// The server's security helpers: which listen addresses count as loopback (a bearer token
// without TLS is accepted only there) and the constant-time token comparison.

#include "gtest/gtest.h"
#include "server/service/server.h"

namespace packsched::service {
namespace {

TEST(IsLoopbackAddress, LoopbackNamesAndAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("127.1.2.3:0"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:8080"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:50051"));
}

TEST(IsLoopbackAddress, EverythingElse) {
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.7:50051"));
  EXPECT_FALSE(IsLoopbackAddress("localhost.example.com:1"));
  EXPECT_FALSE(IsLoopbackAddress("128.0.0.1:1"));
  EXPECT_FALSE(IsLoopbackAddress(""));
}

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
