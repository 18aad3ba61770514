// HOST:PORT as the address flags take it: read exactly, a port out of range refused (gRPC
// would keep its low 16 bits).

#include "server/base/host_port.h"

#include <string>

#include "gtest/gtest.h"

namespace packsched {
namespace {

std::string Error(absl::string_view address, int min_port = 0) {
  return std::string(ParseHostPort(address, min_port).status().message());
}

TEST(ParseHostPort, ReadsHostsAndPorts) {
  absl::StatusOr<HostPort> v4 = ParseHostPort("127.0.0.1:50051");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 50051);
  absl::StatusOr<HostPort> v6 = ParseHostPort("[::1]:0");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  EXPECT_EQ(ParseHostPort("trainer-0.trainer:65535")->port, 65535);
}

TEST(ParseHostPort, APortAbove65535IsRefusedNotWrapped) {
  EXPECT_EQ(Error("127.0.0.1:99999"), "port must be 0..65535");
  EXPECT_EQ(Error("127.0.0.1:65536"), "port must be 0..65535");
  EXPECT_EQ(Error("host:999999"), "port must be 0..65535");
  EXPECT_EQ(Error("host:0", 1), "port must be 1..65535");
  EXPECT_EQ(Error("host:-1"), "port must be 0..65535");
  EXPECT_EQ(Error("host:+1"), "port must be 0..65535");
  EXPECT_EQ(Error("host:80x"), "port must be 0..65535");
  EXPECT_EQ(Error("host:"), "port must be 0..65535");
}

TEST(ParseHostPort, MalformedAddressesSayWhy) {
  EXPECT_EQ(Error(""), "empty; expected HOST:PORT or [V6]:PORT");
  EXPECT_EQ(Error("host"), "no port; expected HOST:PORT or [V6]:PORT");
  EXPECT_EQ(Error(":80"), "no host; expected HOST:PORT or [V6]:PORT");
  EXPECT_EQ(Error("a:1,b:2"), "one address only; expected HOST:PORT or [V6]:PORT");
  EXPECT_EQ(Error("::1:80"), "an IPv6 address needs brackets: [V6]:PORT");
  EXPECT_EQ(Error("[::1]80"), "no ]:PORT after the IPv6 address");
  EXPECT_EQ(Error("[host]:80"), "[host] is not an IPv6 address");
}

}  // namespace
}  // namespace packsched
