#include "server/base/host_port.h"

#include <arpa/inet.h>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace packsched {
namespace {

// The port's digits as a number, or -1: at most 5 digits, so 99999 is read as 99999 (no
// wrap), and "+1", " 1", "0x1" or "" are not ports.
int ReadPort(absl::string_view digits) {
  if (digits.empty() || digits.size() > 5) return -1;
  int port = 0;
  for (const char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return -1;
    port = port * 10 + (c - '0');
  }
  return port;
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, int min_port) {
  const std::string expected = "expected HOST:PORT or [V6]:PORT";
  if (address.empty()) return absl::InvalidArgumentError(absl::StrCat("empty; ", expected));
  if (absl::StrContains(address, ',') || absl::StrContains(address, ' ')) {
    return absl::InvalidArgumentError(absl::StrCat("one address only; ", expected));
  }
  HostPort out;
  absl::string_view port;
  if (absl::ConsumePrefix(&address, "[")) {
    const size_t close = address.find("]:");
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError("no ]:PORT after the IPv6 address");
    }
    out.host = std::string(address.substr(0, close));
    port = address.substr(close + 2);
    in6_addr v6{};
    if (inet_pton(AF_INET6, out.host.c_str(), &v6) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("[", out.host, "] is not an IPv6 address"));
    }
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("no port; ", expected));
    }
    out.host = std::string(address.substr(0, colon));
    port = address.substr(colon + 1);
    if (absl::StrContains(out.host, ':')) {
      return absl::InvalidArgumentError("an IPv6 address needs brackets: [V6]:PORT");
    }
  }
  if (out.host.empty()) return absl::InvalidArgumentError(absl::StrCat("no host; ", expected));
  out.port = ReadPort(port);
  if (out.port < min_port || out.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port must be ", min_port, "..65535"));
  }
  return out;
}

}  // namespace packsched
