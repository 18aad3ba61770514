#ifndef PACKSCHED_SERVER_COLLECTIVE_GLOO_TRANSPORT_H_
#define PACKSCHED_SERVER_COLLECTIVE_GLOO_TRANSPORT_H_

// Internal to the Gloo backend (gloo_collective.h): what every part of it shares with Gloo
// itself — its timeouts, its TCP device, and its exceptions turned into a Status.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gloo/transport/device.h"
#include "server/collective/gloo_collective.h"

namespace packsched::collective::internal {

// What is left until `deadline`, as a Gloo timeout: at least 1 ms (Gloo takes 0 for "none").
std::chrono::milliseconds Remaining(absl::Time deadline);

// A TCP device (one epoll thread) of this formation's own, on `options.hostname` or
// `options.iface`. InvalidArgument for a missing interface or an address Gloo cannot use.
absl::StatusOr<std::shared_ptr<gloo::transport::Device>> CreateDevice(const GlooOptions& options);

// Runs `body`, turning whatever Gloo throws into a Status: DeadlineExceeded for Gloo's timeouts,
// Aborted for anything else (a peer that went away, closed connections).
absl::Status RunGloo(absl::string_view what, int64_t rank, const std::function<void()>& body);

}  // namespace packsched::collective::internal

#endif  // PACKSCHED_SERVER_COLLECTIVE_GLOO_TRANSPORT_H_
