#include "server/base/address.h"

#include <arpa/inet.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace packsched {
namespace {

// The host of "host", "host:port", "[v6]" or "[v6]:port". A bare IPv6 address (two or more
// colons, no brackets) is all host.
absl::string_view HostOf(absl::string_view address) {
  if (absl::ConsumePrefix(&address, "[")) {
    const size_t close = address.find(']');
    return close == absl::string_view::npos ? address : address.substr(0, close);
  }
  const size_t colon = address.find(':');
  if (colon == absl::string_view::npos) return address;
  if (address.find(':', colon + 1) != absl::string_view::npos) return address;  // bare IPv6
  return address.substr(0, colon);
}

}  // namespace

bool IsLoopbackAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  // gRPC target schemes; "dns:///host:port" and "dns://authority/host:port" name the host last.
  if (absl::ConsumePrefix(&address, "dns:")) {
    if (absl::ConsumePrefix(&address, "//")) {
      const size_t slash = address.find('/');
      if (slash == absl::string_view::npos) return false;
      address.remove_prefix(slash + 1);
    }
  } else if (!absl::ConsumePrefix(&address, "ipv4:")) {
    absl::ConsumePrefix(&address, "ipv6:");
  }
  const std::string host(HostOf(address));
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace packsched
