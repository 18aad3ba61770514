#include "server/collective/gloo_transport.h"

#include <net/if.h>

#include <algorithm>
#include <exception>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/common/error.h"
#include "gloo/transport/tcp/device.h"

namespace packsched::collective::internal {

std::chrono::milliseconds Remaining(absl::Time deadline) {
  // Gloo treats 0 as "no timeout"; never hand it 0 or less.
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// One device per formation, as each sidecar process has: ranks formed as threads of one process
// (tests, benchmarks) then behave like separate processes instead of funnelling every rank's
// traffic through one event thread.
absl::StatusOr<std::shared_ptr<gloo::transport::Device>> CreateDevice(const GlooOptions& options) {
  // Checked here: Gloo's own lookup of a missing interface throws and leaks its getifaddrs list.
  if (options.hostname.empty() && !options.iface.empty() &&
      if_nametoindex(options.iface.c_str()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: no network interface named '", options.iface, "'"));
  }
  gloo::transport::tcp::attr attr;
  if (!options.hostname.empty()) {
    attr.hostname = options.hostname;
  } else if (!options.iface.empty()) {
    attr.iface = options.iface;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: cannot create a TCP device for hostname '", options.hostname,
                     "' / iface '", options.iface, "': ", e.what()));
  }
}

absl::Status RunGloo(absl::string_view what, int64_t rank, const std::function<void()>& body) {
  try {
    body();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    const std::string message = absl::StrCat("gloo ", what, " on rank ", rank, ": ", e.what());
    // Gloo's waits say "Timed out ..." (unbound buffers) or "Read timeout" / "Write timeout" /
    // "Connect timeout" (registered buffers and connections).
    const std::string lower = absl::AsciiStrToLower(e.what());
    if (absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout")) {
      return absl::DeadlineExceededError(message);
    }
    return absl::AbortedError(message);
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat("gloo ", what, " on rank ", rank, ": ", e.what()));
  }
}

}  // namespace packsched::collective::internal
