#ifndef PACKSCHED_TESTS_E2E_HEALTH_CHECK_H_
#define PACKSCHED_TESTS_E2E_HEALTH_CHECK_H_

// grpc.health.v1.Health/Check from a test, without the health protos (not shipped with
// Debian's gRPC): the request and response are encoded by hand (both are one field).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace packsched::testing {

// HealthCheckResponse.status values.
enum class Serving { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// The health of `service` ("" for the server as a whole) at `target`.
inline absl::StatusOr<Serving> CheckHealth(const std::string& target, const std::string& service) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  // HealthCheckRequest{service = 1: string}; services here are shorter than 128 bytes.
  std::string encoded;
  if (!service.empty()) {
    encoded = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  }
  grpc::Slice slice(encoded);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // HealthCheckResponse{status = 1: enum}; an empty message is UNKNOWN.
  if (bytes.empty()) return Serving::kUnknown;
  if (bytes.size() != 2 || bytes[0] != '\x08') {
    return absl::InternalError("unexpected health response encoding");
  }
  return static_cast<Serving>(bytes[1]);
}

}  // namespace packsched::testing

#endif  // PACKSCHED_TESTS_E2E_HEALTH_CHECK_H_
