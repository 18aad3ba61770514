#include "server/service/service_call.h"

#include <atomic>

namespace packsched::service {
namespace {

std::atomic<int64_t> live_calls{0};

}  // namespace

int64_t ServiceCall::Live() { return live_calls.load(std::memory_order_relaxed); }

ServiceCall::ServiceCall() { live_calls.fetch_add(1, std::memory_order_relaxed); }

ServiceCall::~ServiceCall() { live_calls.fetch_sub(1, std::memory_order_relaxed); }

}  // namespace packsched::service
