#include "server/service/server.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "server/base/address.h"
#include "server/base/status_macros.h"
#include "server/group/collective_agreement.h"
#include "server/group/group_agreement.h"
#include "server/group/readiness.h"
#include "server/service/scheduler_service.h"

namespace packsched::service {
namespace {

// How long before the end of the shutdown grace period the coordinator answers the rounds still
// outstanding (at most a quarter of the period): time for the answers to reach gRPC first.
constexpr absl::Duration kStopRoundsBeforeGraceEnds = absl::Milliseconds(500);

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " = '", path, "': cannot be read"));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerOptions& o) {
  return ServerCredentialsFromFiles(o.tls_cert, o.tls_key, o.tls_client_ca);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(
    const std::string& tls_cert, const std::string& tls_key, const std::string& tls_client_ca) {
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (tls_cert.empty()) {
    if (!tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.private_key, ReadFile("--tls_key", tls_key));
  ASSIGN_OR_RETURN(pair.cert_chain, ReadFile("--tls_cert", tls_cert));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls_client_ca.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile("--tls_client_ca", tls_client_ca));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::string> ReadPemFile(absl::string_view flag, const std::string& path) {
  return ReadFile(flag, path);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::Status CheckBearerToken(std::optional<absl::string_view> authorization,
                              absl::string_view token) {
  if (token.empty()) return absl::OkStatus();
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  if (!absl::StartsWith(*authorization, kBearerPrefix) ||
      !ConstantTimeEquals(authorization->substr(kBearerPrefix.size()), token)) {
    return absl::UnauthenticatedError("wrong bearer token");
  }
  return absl::OkStatus();
}

struct SchedulerServer::State {
  // The agreement port (server/group/round_agreement.h): the rank group's, or a group of one.
  // Its serving listener sets the Scheduler's health while serving.
  std::shared_ptr<group::RoundAgreements> agreements;
  std::unique_ptr<RoundCoordinator> coordinator;
  std::unique_ptr<SchedulerService> service;  // outlives `server` (declared before it)
  std::unique_ptr<grpc::Server> server;
  // With a rank group of several: waits for every rank to join (the serving listener then sets
  // the Scheduler's health). Declared last: stopped before anything it calls is destroyed.
  std::unique_ptr<group::ReadinessWatch> readiness;
  int port = 0;
  bool shut_down = false;
};

SchedulerServer::SchedulerServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

SchedulerServer::~SchedulerServer() { Shutdown(absl::ZeroDuration()); }

int SchedulerServer::port() const { return state_->port; }

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(
    const ServerOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, Credentials(options));
  if (!options.auth_token.empty() && options.tls_cert.empty() &&
      !IsLoopbackAddress(options.listen)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a bearer token is accepted only over TLS or on loopback: --listen = ", options.listen,
        " needs --tls_cert and --tls_key"));
  }

  auto state = std::make_unique<State>();
  if (options.group != nullptr) {
    state->agreements = std::make_shared<group::GroupAgreements>(*options.group);
  } else {
    state->agreements =  // a group of one
        std::make_shared<group::CollectiveAgreements>(options.limits.collective_timeout);
  }
  RoundCoordinator::Options coordinator_options;
  coordinator_options.limits = options.limits;
  coordinator_options.agreements = state->agreements;
  coordinator_options.cancel_waits = options.cancel_group_waits;
  state->coordinator = std::make_unique<RoundCoordinator>(std::move(coordinator_options));
  SchedulerService::Options service_options;
  service_options.limits = options.limits;
  service_options.auth_token = options.auth_token;
  service_options.rank = options.rank;
  service_options.build_version = options.build_version;
  state->service =
      std::make_unique<SchedulerService>(state->coordinator.get(), std::move(service_options));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, credentials, &state->port);
  builder.RegisterService(state->service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(options.max_receive_message_bytes, std::numeric_limits<int>::max())));
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(options.max_concurrent_streams));
  grpc::ResourceQuota quota("packsched-server");
  quota.Resize(static_cast<size_t>(options.resource_quota_bytes));
  quota.SetMaxThreads(static_cast<int>(options.max_threads));
  builder.SetResourceQuota(quota);
  state->server = builder.BuildAndStart();
  if (state->server == nullptr || state->port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  grpc::HealthCheckServiceInterface* health = state->server->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(true);
  if (health != nullptr) {
    // Liveness is the server's own status (""); readiness is the Scheduler service's: SERVING
    // while the agreement port is serving — with a rank group, Group::serving(): every rank of
    // the group has joined the run, and no stream is between generations; a group of one at
    // once — exactly what GetStatus reports as group_ready.
    const std::string service = v1::Scheduler::service_full_name();
    state->agreements->SetServingListener(
        [health, service](bool serving) { health->SetServingStatus(service, serving); });
  }
  if (health != nullptr && options.group != nullptr && options.group->options().world_size > 1) {
    state->readiness = std::make_unique<group::ReadinessWatch>(*options.group, nullptr);
  }
  return std::unique_ptr<SchedulerServer>(new SchedulerServer(std::move(state)));
}

void SchedulerServer::Shutdown(absl::Duration grace) {
  if (state_->shut_down) return;
  state_->shut_down = true;
  // Before the health status they would set.
  state_->agreements->SetServingListener(nullptr);
  state_->readiness.reset();
  if (grpc::HealthCheckServiceInterface* health = state_->server->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  // grpc::Server::Shutdown waits for every call to end, and a call waiting on a round ends only
  // when the round does. At its deadline gRPC cancels the calls left ("Cancelling all calls",
  // without our served marker), and clients would take a round that reached this sidecar and
  // failed for one that never did, and retry it. So the coordinator stops a little earlier and
  // answers every outstanding round itself (final, with the marker); stopping also aborts the
  // streams' collectives and cancels the group's store waits, so no round holds the shutdown.
  const absl::Time deadline = absl::Now() + grace;
  const absl::Time stop_rounds_at = deadline - std::min(grace / 4, kStopRoundsBeforeGraceEnds);
  absl::Notification server_down;
  std::thread stopper([this, stop_rounds_at, &server_down] {
    if (!server_down.WaitForNotificationWithDeadline(stop_rounds_at)) {
      state_->coordinator->Shutdown();
    }
  });
  state_->server->Shutdown(absl::ToChronoTime(deadline));
  server_down.Notify();
  stopper.join();
  state_->coordinator->Shutdown();
  state_->server->Wait();
}

}  // namespace packsched::service
