#include "server/service/server.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "server/base/status_macros.h"
#include "server/security/credentials.h"
#include "server/service/scheduler_service.h"

namespace packsched::service {
namespace {

// How long before the end of the shutdown grace period the coordinator answers the rounds still
// outstanding (at most a quarter of the period): time for the answers to reach gRPC first.
constexpr absl::Duration kStopRoundsBeforeGraceEnds = absl::Milliseconds(500);
// How often a shutdown checks whether calls are still in progress.
constexpr absl::Duration kCallPoll = absl::Milliseconds(5);

}  // namespace

struct SchedulerServer::State {
  // The agreement port (server/group/round_agreement.h), as the sidecar chose it. Its serving
  // listener sets the Scheduler's health while serving.
  std::shared_ptr<group::RoundAgreements> agreements;
  std::unique_ptr<RoundCoordinator> coordinator;
  std::unique_ptr<SchedulerService> service;  // outlives `server` (declared before it)
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  bool shut_down = false;
};

SchedulerServer::SchedulerServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

SchedulerServer::~SchedulerServer() { Shutdown(absl::ZeroDuration()); }

int SchedulerServer::port() const { return state_->port; }

RoundCoordinator::Stats SchedulerServer::GetStats() const {
  return state_->coordinator->GetStats();
}

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(
    const ServerOptions& options) {
  ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::ServerCredentials> credentials,
      security::MakeServerCredentials({options.tls_cert, options.tls_key, options.tls_client_ca}));
  RETURN_IF_ERROR(security::CheckTokenMayBeAccepted(options.auth_token, !options.tls_cert.empty(),
                                                    options.listen, "--listen ="));
  if (options.agreements == nullptr) {
    return absl::InvalidArgumentError("the server needs its agreements (ServerOptions)");
  }

  auto state = std::make_unique<State>();
  state->agreements = options.agreements;
  RoundCoordinator::Options coordinator_options;
  coordinator_options.limits = options.limits;
  coordinator_options.agreements = state->agreements;
  coordinator_options.cancel_waits = options.cancel_group_waits;
  coordinator_options.metrics = options.metrics;
  coordinator_options.backend = options.backend;
  state->coordinator = std::make_unique<RoundCoordinator>(std::move(coordinator_options));
  SchedulerService::Options service_options;
  service_options.limits = options.limits;
  service_options.auth_token = options.auth_token;
  service_options.rank = options.rank;
  service_options.build_version = options.build_version;
  service_options.metrics = options.metrics;
  service_options.planning_threads =
      options.planning_threads > 0 ? options.planning_threads : WorkPool::DefaultThreads();
  service_options.planning_queue = options.planning_queue;
  state->service =
      std::make_unique<SchedulerService>(state->coordinator.get(), std::move(service_options));
  RETURN_IF_ERROR(state->service->PlanningStarted());

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
    // the group has joined the run (the sidecar's readiness watch finds out), and no stream is
    // between generations; a group of one at once — exactly what GetStatus reports as
    // group_ready.
    const std::string service = v1::Scheduler::service_full_name();
    state->agreements->SetServingListener(
        [health, service](bool serving) { health->SetServingStatus(service, serving); });
  }
  return std::unique_ptr<SchedulerServer>(new SchedulerServer(std::move(state)));
}

void SchedulerServer::Shutdown(absl::Duration grace) {
  if (state_->shut_down) return;
  state_->shut_down = true;
  // Before the health status they would set.
  state_->agreements->SetServingListener(nullptr);
  if (grpc::HealthCheckServiceInterface* health = state_->server->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  // New calls are refused from here on (UNAVAILABLE, as gRPC does after its Shutdown); calls in
  // progress run on. gRPC's Shutdown(deadline) would also wait for every connected client to
  // close its connection, idle ones included — until the deadline, whatever is in progress — so
  // it is called only once nothing is: at once when no call is left (their responses written),
  // else when the grace ends, cancelling what is left.
  //
  // Rounds outlast a call's own work, and at its deadline gRPC cancels the calls left ("Cancelling
  // all calls", without our served marker): clients would take a round that reached this sidecar
  // and failed for one that never did, and retry it. So the coordinator stops a little earlier
  // and answers every outstanding round itself (final, with the marker); stopping also aborts the
  // streams' collectives and cancels the group's store waits, so no round holds the shutdown.
  state_->service->RefuseNewCalls();
  // Planning in progress stops at its next check (a millisecond at most) and answers UNAVAILABLE
  // unmarked, as a refused call: the caller may send it again to the restarted sidecar.
  state_->service->StopPlanning();
  const absl::Time deadline = absl::Now() + grace;
  const absl::Time stop_rounds_at = deadline - std::min(grace / 4, kStopRoundsBeforeGraceEnds);
  auto wait_for_calls_until = [](absl::Time until) {
    while (SchedulerService::CallsInProgress() > 0 && absl::Now() < until) {
      absl::SleepFor(kCallPoll);
    }
    return SchedulerService::CallsInProgress() == 0;
  };
  if (!wait_for_calls_until(stop_rounds_at)) {
    state_->coordinator->Shutdown();
    wait_for_calls_until(deadline);
  }
  state_->server->Shutdown(absl::ToChronoTime(absl::Now()));
  state_->coordinator->Shutdown();
  state_->server->Wait();
}

}  // namespace packsched::service
