#include "server/service/health_probe.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "server/base/status_macros.h"
#include "server/security/credentials.h"

namespace packsched::service {

absl::StatusOr<std::shared_ptr<grpc::Channel>> ProbeChannel(const std::string& target,
                                                            const ProbeTls* tls) {
  if (tls == nullptr) return security::MakeChannel(target, std::nullopt);
  if (tls->root_certs_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS probe needs the CA that signed the server's "
        "certificate");
  }
  security::ChannelTls channel_tls;
  channel_tls.root_certs = {"the probe's CA (--probe_tls_ca, --tls_client_ca)",
                            tls->root_certs_file};
  channel_tls.cert = {"--tls_cert", tls->cert_file};
  channel_tls.key = {"--tls_key", tls->key_file};
  channel_tls.server_name = tls->server_name;
  return security::MakeChannel(target, channel_tls);
}

absl::StatusOr<Serving> CheckHealth(const std::string& target, absl::string_view service,
                                    absl::Time deadline, const ProbeTls* tls) {
  if (service.size() >= 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("health service name of ", service.size(), " bytes: at most 127"));
  }
  // HealthCheckRequest{string service = 1}: tag 0x0a, a one-byte length, the bytes.
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes =
        absl::StrCat("\x0a", std::string(1, static_cast<char>(service.size())), service);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, ProbeChannel(target, tls));
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  grpc::Slice slice(request_bytes);
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
    return absl::Status(
        static_cast<absl::StatusCode>(status.error_code()),
        absl::StrCat("health check of '", service, "' at ", target, ": ", status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // HealthCheckResponse{ServingStatus status = 1}: empty when UNKNOWN (the default value).
  if (bytes.empty()) return Serving::kUnknown;
  if (bytes.size() != 2 || bytes[0] != '\x08' || bytes[1] < 0 || bytes[1] > 3) {
    return absl::InternalError(
        absl::StrCat("malformed health response of ", bytes.size(), " bytes from ", target));
  }
  return static_cast<Serving>(bytes[1]);
}

}  // namespace packsched::service
