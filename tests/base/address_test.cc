// Which addresses count as loopback: a bearer token goes without TLS only to those.

#include "server/base/address.h"

#include "gtest/gtest.h"

namespace packsched {
namespace {

TEST(IsLoopbackAddress, LoopbackNamesAndAddresses) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("127.1.2.3:0"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:8080"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:50051"));
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_TRUE(IsLoopbackAddress("[::ffff:127.0.0.1]:1"));
}

TEST(IsLoopbackAddress, GrpcTargetSchemes) {
  EXPECT_TRUE(IsLoopbackAddress("dns:///localhost:50051"));
  EXPECT_TRUE(IsLoopbackAddress("dns://8.8.8.8/127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("dns:127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("ipv4:127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackAddress("ipv6:[::1]:50051"));
  EXPECT_TRUE(IsLoopbackAddress("unix:/run/packsched.sock"));
  EXPECT_TRUE(IsLoopbackAddress("unix-abstract:packsched"));
  EXPECT_FALSE(IsLoopbackAddress("dns:///sidecar.example.com:50051"));
  EXPECT_FALSE(IsLoopbackAddress("ipv4:10.0.0.7:50051"));
  EXPECT_FALSE(IsLoopbackAddress("dns://localhost"));  // an authority without a host
}

TEST(IsLoopbackAddress, EverythingElse) {
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:50051"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.7:50051"));
  EXPECT_FALSE(IsLoopbackAddress("localhost.example.com:1"));
  EXPECT_FALSE(IsLoopbackAddress("128.0.0.1:1"));
  EXPECT_FALSE(IsLoopbackAddress("[::ffff:10.0.0.1]:1"));
  // Names are not addresses: a host named "127.evil.example" resolves wherever its owner likes.
  EXPECT_FALSE(IsLoopbackAddress("127.evil.example:50051"));
  EXPECT_FALSE(IsLoopbackAddress("127.0.0.1.nip.io:1"));
  EXPECT_FALSE(IsLoopbackAddress(""));
}

}  // namespace
}  // namespace packsched
