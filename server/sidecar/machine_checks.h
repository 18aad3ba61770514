#ifndef PACKSCHED_SERVER_SIDECAR_MACHINE_CHECKS_H_
#define PACKSCHED_SERVER_SIDECAR_MACHINE_CHECKS_H_

// What a flag asks of this machine, checked before the sidecar starts (flag_checks.h): a
// network interface Gloo can use, an address Gloo can bind, threads the process may create.
// Errors say which rule the value breaks, without naming the flag: the caller does.

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace packsched::sidecar {

// `iface` is a network interface of this machine with an IPv4 or IPv6 address: what Gloo's TCP
// transport takes its address from (getifaddrs). InvalidArgument "no network interface named
// 'x' (there are: lo, eth0)" or "interface 'x' has no IPv4 or IPv6 address".
absl::Status CheckInterface(absl::string_view iface);

// `host` (a name or a numeric address, no port) resolves to an address this machine can bind
// a TCP socket to, as Gloo will: checked by binding one to port 0 and closing it at once.
// InvalidArgument "does not resolve (...)" or "is not an address of this machine (...)".
absl::Status CheckLocalAddress(absl::string_view host);

// The most threads this process may have, when something limits it below what the kernel
// allows: RLIMIT_NPROC's soft limit (counted over the user's processes and threads; not
// applied to root), or the
// pids.max of the process's cgroup (v2), whichever is lower. nullopt when neither is set.
std::optional<int64_t> ThreadLimit();

}  // namespace packsched::sidecar

#endif  // PACKSCHED_SERVER_SIDECAR_MACHINE_CHECKS_H_
