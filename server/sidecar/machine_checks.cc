#include "server/sidecar/machine_checks.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <set>
#include <string>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace packsched::sidecar {
namespace {

// pids.max of this process's cgroup (v2: /proc/self/cgroup's "0::PATH" line), or nullopt for
// "max", cgroup v1 or no cgroup file system.
std::optional<int64_t> CgroupPidsMax() {
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup, line)) {
    absl::string_view path = line;
    if (!absl::ConsumePrefix(&path, "0::")) continue;
    std::ifstream limit(absl::StrCat("/sys/fs/cgroup", path, "/pids.max"));
    std::string value;
    int64_t pids = 0;
    if (limit >> value && absl::SimpleAtoi(value, &pids) && pids > 0) return pids;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

absl::Status CheckInterface(absl::string_view iface) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InvalidArgumentError("cannot list this machine's network interfaces");
  }
  std::set<std::string> names;
  bool found = false;
  bool has_ip = false;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    names.insert(a->ifa_name);
    if (iface != a->ifa_name) continue;
    found = true;
    if (a->ifa_addr != nullptr &&
        (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6)) {
      has_ip = true;
    }
  }
  freeifaddrs(list);
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no network interface named '", iface, "' (there are: ", absl::StrJoin(names, ", "), ")"));
  }
  if (!has_ip) {
    return absl::InvalidArgumentError(
        absl::StrCat("interface '", iface, "' has no IPv4 or IPv6 address"));
  }
  return absl::OkStatus();
}

absl::Status CheckLocalAddress(absl::string_view host) {
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string name(host);
  if (const int rc = getaddrinfo(name.c_str(), "0", &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("does not resolve (", gai_strerror(rc), ")"));
  }
  std::string why = "no address";
  bool bound = false;
  for (const addrinfo* a = found; a != nullptr && !bound; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      bound = true;
    } else {
      why = std::error_code(errno, std::generic_category()).message();
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (bound) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("is not an address of this machine (bind: ", why, ")"));
}

std::optional<int64_t> ThreadLimit() {
  std::optional<int64_t> limit = CgroupPidsMax();
  // The kernel does not apply RLIMIT_NPROC to root.
  rlimit nproc = {};
  if (geteuid() != 0 && getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY) {
    const auto soft = static_cast<int64_t>(nproc.rlim_cur);
    limit = limit ? std::min(*limit, soft) : soft;
  }
  return limit;
}

}  // namespace packsched::sidecar
