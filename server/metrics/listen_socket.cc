#include "server/metrics/listen_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace packsched::metrics {
namespace {

struct HostPort {
  std::string host;
  std::string port;
  bool bracketed = false;
};

bool AllDigits(absl::string_view s) {
  if (s.empty() || s.size() > 5) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

absl::StatusOr<HostPort> Split(absl::string_view flag, absl::string_view listen) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " = '", listen, "': ", why,
                                                   "; expected one HOST:PORT or [V6]:PORT"));
  };
  if (absl::StrContains(listen, ',') || absl::StrContains(listen, ' ')) {
    return bad("one address only");
  }
  HostPort hp;
  if (absl::ConsumePrefix(&listen, "[")) {
    const size_t close = listen.find("]:");
    if (close == absl::string_view::npos) return bad("no ]:PORT after the IPv6 address");
    hp.host = std::string(listen.substr(0, close));
    hp.port = std::string(listen.substr(close + 2));
    hp.bracketed = true;
  } else {
    const size_t colon = listen.rfind(':');
    if (colon == absl::string_view::npos) return bad("no port");
    hp.host = std::string(listen.substr(0, colon));
    hp.port = std::string(listen.substr(colon + 1));
    if (absl::StrContains(hp.host, ':')) return bad("an IPv6 address needs brackets");
  }
  int port = -1;
  if (hp.host.empty()) return bad("no host");
  if (!AllDigits(hp.port) || !absl::SimpleAtoi(hp.port, &port) || port > 65535) {
    return bad("the port must be a number in [0, 65535]");
  }
  if (hp.bracketed) {
    in6_addr v6{};
    if (inet_pton(AF_INET6, hp.host.c_str(), &v6) != 1) return bad("not an IPv6 address");
  }
  return hp;
}

// The numeric address of `sa`, with its port: "1.2.3.4:80" or "[::1]:80".
std::string Format(const sockaddr_storage& sa, int* port) {
  char host[INET6_ADDRSTRLEN] = {};
  if (sa.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    *port = ntohs(v6->sin6_port);
    return absl::StrCat("[", host, "]:", *port);
  }
  const auto* v4 = reinterpret_cast<const sockaddr_in*>(&sa);
  inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
  *port = ntohs(v4->sin_port);
  return absl::StrCat(host, ":", *port);
}

}  // namespace

absl::StatusOr<ListenSocket> BindListenSocket(absl::string_view flag, const std::string& listen) {
  absl::StatusOr<HostPort> hp = Split(flag, listen);
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (hp->bracketed ? AI_NUMERICHOST : 0);
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(hp->host.c_str(), hp->port.c_str(), &hints, &found);
      rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " = '", listen, "': cannot resolve '", hp->host, "': ", gai_strerror(rc)));
  }
  // The first address only: one flag, one socket.
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(found);
    return absl::UnavailableError(absl::StrCat(
        "--", flag, " = '", listen, "': socket: ", std::generic_category().message(errno)));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (found->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  const bool bound = bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 128) == 0;
  const int bind_errno = errno;
  freeaddrinfo(found);
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (!bound || getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("--", flag, " = '", listen, "': cannot bind: ",
                                               std::generic_category().message(bind_errno)));
  }
  ListenSocket s;
  s.fd = fd;
  s.address = Format(local, &s.port);
  return s;
}

}  // namespace packsched::metrics
