#ifndef PACKSCHED_SERVER_METRICS_LISTEN_SOCKET_H_
#define PACKSCHED_SERVER_METRICS_LISTEN_SOCKET_H_

// One listening TCP socket from one HOST:PORT, IPv4 or IPv6: what --metrics_listen binds.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packsched::metrics {

// A bound, listening, non-blocking socket and the address it is bound to.
struct ListenSocket {
  int fd = -1;          // owned by the caller: close() it
  int port = 0;         // the bound port (the chosen one for port 0)
  std::string address;  // numeric HOST:PORT as bound, "[V6]:PORT" for IPv6
};

// Binds and listens on exactly one address: `listen` is HOST:PORT or [V6]:PORT, HOST a numeric
// address or a name (its first address is taken), PORT decimal in [0, 65535] (0: a free one).
// InvalidArgument (naming `flag`) for anything else — a list, a missing port or host, a
// bracketed host that is not IPv6 — or a name that does not resolve; Unavailable when it cannot
// bind.
absl::StatusOr<ListenSocket> BindListenSocket(absl::string_view flag, const std::string& listen);

}  // namespace packsched::metrics

#endif  // PACKSCHED_SERVER_METRICS_LISTEN_SOCKET_H_
