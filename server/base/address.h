#ifndef PACKSCHED_SERVER_BASE_ADDRESS_H_
#define PACKSCHED_SERVER_BASE_ADDRESS_H_

// Which addresses count as this machine's own: a bearer token travels without TLS only to (and
// is accepted without TLS only on) one of those.

#include "absl/strings/string_view.h"

namespace packsched {

// True when `address` can only reach this machine: a listen address or a gRPC target whose host
// is `localhost` or a numeric loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z), with or
// without a port and gRPC's "dns:", "dns:///", "ipv4:" or "ipv6:" scheme; and every "unix:" or
// "unix-abstract:" socket. A name that merely starts with "127." is not loopback.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace packsched

#endif  // PACKSCHED_SERVER_BASE_ADDRESS_H_
