#ifndef PACKSCHED_SERVER_BASE_HOST_PORT_H_
#define PACKSCHED_SERVER_BASE_HOST_PORT_H_

// One HOST:PORT address, as the address flags of packsched-server take it (--listen,
// --rendezvous, --rendezvous_listen, --metrics_listen, --probe, --status): read exactly, so a
// port out of range is refused instead of wrapping (gRPC keeps the low 16 bits of 99999).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packsched {

struct HostPort {
  std::string host;  // a name, an IPv4 address or an IPv6 address (without its brackets)
  int port = 0;      // [0, 65535]
};

// Parses "HOST:PORT" or "[V6]:PORT": HOST not empty, without spaces or commas, an IPv6 address
// only in brackets (and then a valid one); PORT 1 to 5 decimal digits in [min_port, 65535].
// Returns InvalidArgument saying which rule `address` breaks (e.g. "port must be 0..65535"),
// without naming a flag: the caller does. REQUIRES: 0 <= min_port <= 65535.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address, int min_port = 0);

}  // namespace packsched

#endif  // PACKSCHED_SERVER_BASE_HOST_PORT_H_
