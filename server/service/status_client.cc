#include "server/service/status_client.h"

#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "packsched/v1/scheduler.grpc.pb.h"
#include "server/base/status_macros.h"
#include "server/security/credentials.h"

namespace packsched::service {

absl::StatusOr<v1::GetStatusResponse> FetchStatus(const std::string& target, absl::Time deadline,
                                                  const ProbeTls* tls,
                                                  const std::string& auth_token) {
  RETURN_IF_ERROR(security::CheckTokenMayBeSent(auth_token, tls != nullptr, target,
                                                "--status =", "--tls_cert"));
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, ProbeChannel(target, tls));
  std::unique_ptr<v1::Scheduler::Stub> stub = v1::Scheduler::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (!auth_token.empty()) security::AddBearerToken(context, auth_token);
  v1::GetStatusResponse response;
  const grpc::Status status = stub->GetStatus(&context, v1::GetStatusRequest(), &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("GetStatus at ", target, ": ", status.error_message()));
  }
  return response;
}

std::string StatusJson(const v1::GetStatusResponse& status) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Cannot fail for a message of this process's own descriptor pool.
  (void)google::protobuf::util::MessageToJsonString(status, &json, options);
  return json;
}

}  // namespace packsched::service
