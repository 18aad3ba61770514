#include "server/service/scheduler_service.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "server/base/status_macros.h"
#include "server/security/credentials.h"
#include "server/service/balance_batch.h"
#include "server/service/convert.h"
#include "server/service/dynamic_cp.h"
#include "server/service/partition.h"
#include "server/service/service_call.h"

namespace packsched::service {
namespace {

constexpr absl::string_view kServedKey = "packsched-served";

using PlanCall = TypedCall<v1::PlanRequest, v1::PlanResponse>;
using PartitionCall = TypedCall<v1::PartitionRequest, v1::PlanResponse>;
using BalanceBatchCall = TypedCall<v1::BalanceBatchRequest, v1::BalanceBatchResponse>;
using GetStatusCall = TypedCall<v1::GetStatusRequest, v1::GetStatusResponse>;
using PlanDynamicCpCall = TypedCall<v1::PlanDynamicCpRequest, v1::PlanDynamicCpResponse>;

// Hands `reservation` to the call's arena when `response` lives on one, so that it ends when the
// call is done — after the response is written. Otherwise it stays with the caller, which holds
// it until the call is finished.
void HoldUntilFreed(google::protobuf::Message* response,
                    std::optional<MemoryBudget::Reservation>* reservation) {
  if (!reservation->has_value()) return;
  if (google::protobuf::Arena* arena = response->GetArena(); arena != nullptr) {
    arena->Own(new MemoryBudget::Reservation(std::move(**reservation)));
    reservation->reset();
  }
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

SchedulerService::SchedulerService(RoundCoordinator* coordinator, Options options)
    : coordinator_(coordinator),
      options_(std::move(options)),
      budget_(options_.limits.max_inflight_bytes),
      planning_(options_.planning_threads, options_.planning_queue, "ps-plan") {}

absl::StatusOr<MemoryBudget::Reservation> SchedulerService::Reserve(const RequestMemory& memory,
                                                                    absl::string_view what) {
  return budget_.Reserve(
      memory.bytes,
      absl::StrCat(what, " (n = ", memory.sequences, ", k up to ", memory.micro_batches,
                   memory.ranks > 0 ? absl::StrCat(", W = ", memory.ranks) : std::string(),
                   memory.forest ? absl::StrCat(", node occurrences up to ",
                                                memory.isolated_entries + memory.split_entries)
                                 : std::string(),
                   ", ", memory.wire_bytes, " bytes on the wire)"));
}

void SchedulerService::RefuseNewCalls() { refusing_.store(true, std::memory_order_release); }

void SchedulerService::StopPlanning() { planning_.Shutdown(); }

absl::Status SchedulerService::PlanningStarted() const {
  const absl::Status started = planning_.started();
  if (started.ok()) return absl::OkStatus();
  return absl::Status(started.code(),
                      absl::StrCat("--planning_threads = ", options_.planning_threads,
                                   ": cannot start the planning workers: ", started.message()));
}

void SchedulerService::RunOnWorker(
    metrics::Method method, grpc::CallbackServerContext* context, ServiceCall* call,
    absl::AnyInvocable<absl::Status(const std::function<absl::Status()>& stop) &&> work,
    int64_t* done) {
  absl::Status submitted =
      planning_.Submit([this, method, context, call, done,
                        work = std::move(work)](const std::atomic<bool>& stopping) mutable {
        const std::chrono::system_clock::time_point deadline = context->deadline();
        const std::function<absl::Status()> stop = [&stopping, context,
                                                    deadline]() -> absl::Status {
          if (stopping.load(std::memory_order_acquire)) {
            return absl::UnavailableError("the sidecar is shutting down: planning stopped");
          }
          // The deadline first: gRPC cancels a call whose deadline passed too, and that call
          // (one that waited in the queue past it, or ran past it) is DEADLINE_EXCEEDED. gRPC's
          // timer runs on its own clock, which context->deadline() is converted from: a call it
          // cancelled for its deadline can be seen here a little before system_clock reaches
          // that deadline, so a cancellation within kDeadlineSkew of it is the deadline's.
          constexpr std::chrono::milliseconds kDeadlineSkew{100};
          const auto now = std::chrono::system_clock::now();
          if (now >= deadline) {
            return absl::DeadlineExceededError("the caller's deadline passed: planning stopped");
          }
          if (context->IsCancelled()) {
            if (now + kDeadlineSkew >= deadline) {
              return absl::DeadlineExceededError("the caller's deadline passed: planning stopped");
            }
            return absl::CancelledError("the caller cancelled the call");
          }
          return absl::OkStatus();
        };
        absl::Status status = stop();
        if (status.ok()) status = std::move(work)(stop);
        if (!status.ok() && stopping.load(std::memory_order_acquire)) {
          // As a call refused at shutdown: not marked as served, so the caller may send it again.
          call->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(status.message())));
          return;
        }
        if (status.ok()) {
          absl::MutexLock lock(&mu_);
          ++*done;
        }
        Finish(method, context, call, status);
      });
  if (!submitted.ok()) Finish(method, context, call, submitted);
}

int64_t SchedulerService::CallsInProgress() { return ServiceCall::Live(); }

template <typename Call>
bool SchedulerService::Begin(metrics::Method method, grpc::CallbackServerContext* context,
                             const grpc::ByteBuffer& in, Call* call) {
  if (refusing_.load(std::memory_order_acquire)) {
    // As gRPC's own refusal once the server has shut down: not marked as served, so clients keep
    // trying to reach their sidecar (its restart) instead of taking this as the round's answer.
    call->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the sidecar is shutting down"));
    return false;
  }
  absl::Status status = Authorize(*context);
  if (status.ok()) status = call->Parse(in);
  if (!status.ok()) {
    Finish(method, context, call, status);
    return false;
  }
  return true;
}

absl::Status SchedulerService::Authorize(const grpc::CallbackServerContext& context) const {
  return security::CheckBearerToken(security::AuthorizationOf(context), options_.auth_token);
}

void SchedulerService::Finish(metrics::Method method, grpc::CallbackServerContext* context,
                              ServiceCall* call, const absl::Status& status) {
  context->AddTrailingMetadata(std::string(kServedKey), "1");
  if (options_.metrics != nullptr) options_.metrics->Request(method, status.code());
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    ++errors_by_code_[absl::StatusCodeToString(status.code())];
  }
  call->Answer(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* SchedulerService::Plan(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* in,
                                                 grpc::ByteBuffer* out) {
  auto* call = new PlanCall(out);  // deletes itself when done (service_call.h)
  if (!Begin(metrics::Method::kPlan, context, *in, call)) return call;
  const v1::PlanRequest* request = call->request();
  v1::PlanResponse* response = call->response();
  absl::StatusOr<RoundInput> input = ToRoundInput(*request, options_.limits);
  if (!input.ok()) {
    Finish(metrics::Method::kPlan, context, call, input.status());
    return call;
  }
  // Every caller reserves its own estimate, joiners and cache hits included: they share the
  // plan but build their own response and wire copy (docs/design.md §3). A request over the
  // budget joins its round with the refusal, so its peers fail with it too.
  std::optional<MemoryBudget::Reservation> reservation;
  if (input->error.ok()) {
    absl::StatusOr<MemoryBudget::Reservation> reserved =
        Reserve(EstimatePlanMemory(*request, options_.limits), "this Plan request");
    if (reserved.ok()) {
      reservation = *std::move(reserved);
    } else {
      input->error = reserved.status();
      input->input = PlanInput();
    }
  }
  HoldUntilFreed(response, &reservation);
  coordinator_->Submit(*std::move(input),
                       [this, context, call, response, held = std::move(reservation)](
                           absl::StatusOr<std::shared_ptr<const RoundResult>> result) {
                         if (result.ok()) RoundResultToProto(**result, response);
                         Finish(metrics::Method::kPlan, context, call, result.status());
                       });
  return call;
}

grpc::ServerUnaryReactor* SchedulerService::Partition(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  auto* call = new PartitionCall(out);
  if (!Begin(metrics::Method::kPartition, context, *in, call)) return call;
  const v1::PartitionRequest* request = call->request();
  v1::PlanResponse* response = call->response();
  std::optional<MemoryBudget::Reservation> reservation;
  if (absl::StatusOr<MemoryBudget::Reservation> reserved =
          Reserve(EstimatePartitionMemory(*request, options_.limits), "this Partition request");
      reserved.ok()) {
    reservation = *std::move(reserved);
  } else {
    Finish(metrics::Method::kPartition, context, call, reserved.status());
    return call;
  }
  HoldUntilFreed(response, &reservation);
  RunOnWorker(
      metrics::Method::kPartition, context, call,
      [this, request, response,
       held = std::move(reservation)](const std::function<absl::Status()>&) {
        return RunPartition(*request, options_.limits, response);
      },
      &partitions_);
  return call;
}

grpc::ServerUnaryReactor* SchedulerService::BalanceBatch(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* in,
                                                         grpc::ByteBuffer* out) {
  auto* call = new BalanceBatchCall(out);
  if (!Begin(metrics::Method::kBalanceBatch, context, *in, call)) return call;
  const v1::BalanceBatchRequest* request = call->request();
  v1::BalanceBatchResponse* response = call->response();
  std::optional<MemoryBudget::Reservation> reservation;
  if (absl::StatusOr<MemoryBudget::Reservation> reserved = Reserve(
          EstimateBalanceBatchMemory(*request, options_.limits), "this BalanceBatch request");
      reserved.ok()) {
    reservation = *std::move(reserved);
  } else {
    Finish(metrics::Method::kBalanceBatch, context, call, reserved.status());
    return call;
  }
  HoldUntilFreed(response, &reservation);
  RunOnWorker(
      metrics::Method::kBalanceBatch, context, call,
      [this, request, response,
       held = std::move(reservation)](const std::function<absl::Status()>& stop) {
        return RunBalanceBatch(*request, options_.limits, stop, response);
      },
      &balance_batches_);
  return call;
}

grpc::ServerUnaryReactor* SchedulerService::PlanDynamicCp(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* in,
                                                          grpc::ByteBuffer* out) {
  auto* call = new PlanDynamicCpCall(out);
  if (!Begin(metrics::Method::kPlanDynamicCp, context, *in, call)) return call;
  const v1::PlanDynamicCpRequest* request = call->request();
  v1::PlanDynamicCpResponse* response = call->response();
  // With a stream, the round that checks every rank sent the same step comes first: it runs on
  // the stream's worker as Plan's rounds do, and planning follows on the planning workers.
  std::optional<RoundInput> round;
  if (!request->stream().empty() || request->round() != 0) {
    absl::StatusOr<RoundInput> made = ToDynamicCpRound(*request, options_.limits);
    if (!made.ok()) {
      Finish(metrics::Method::kPlanDynamicCp, context, call, made.status());
      return call;
    }
    round = *std::move(made);
  }
  std::optional<MemoryBudget::Reservation> reservation;
  absl::StatusOr<MemoryBudget::Reservation> reserved =
      Reserve(EstimateDynamicCpMemory(*request, options_.limits), "this PlanDynamicCp request");
  if (reserved.ok()) {
    reservation = *std::move(reserved);
  } else if (round.has_value()) {
    // As Plan's: a request over the budget joins its round with the refusal.
    if (round->error.ok()) round->error = reserved.status();
  } else {
    Finish(metrics::Method::kPlanDynamicCp, context, call, reserved.status());
    return call;
  }
  HoldUntilFreed(response, &reservation);
  auto plan = [this, context, call, request, response, held = std::move(reservation)]() mutable {
    RunOnWorker(
        metrics::Method::kPlanDynamicCp, context, call,
        [this, request, response,
         held = std::move(held)](const std::function<absl::Status()>& stop) {
          // The views, once their size is known: held with the response, as the first part is
          // (or, without an arena, until planning ends).
          std::optional<MemoryBudget::Reservation> views;
          const auto reserve = [this, response, &views](int64_t bytes) -> absl::Status {
            absl::StatusOr<MemoryBudget::Reservation> reserved = budget_.Reserve(
                bytes, absl::StrCat("this PlanDynamicCp response's views (", bytes, " bytes)"));
            if (!reserved.ok()) return reserved.status();
            views = *std::move(reserved);
            HoldUntilFreed(response, &views);
            return absl::OkStatus();
          };
          return RunPlanDynamicCp(*request, options_.limits, stop, reserve, response);
        },
        &dynamic_cp_plans_);
  };
  if (!round.has_value()) {
    plan();
    return call;
  }
  coordinator_->Submit(
      *std::move(round),
      [this, context, call, plan = std::move(plan)](
          const absl::StatusOr<std::shared_ptr<const RoundResult>>& agreed) mutable {
        if (agreed.ok()) {
          plan();
        } else {
          Finish(metrics::Method::kPlanDynamicCp, context, call, ExplainStepRound(agreed.status()));
        }
      });
  return call;
}

grpc::ServerUnaryReactor* SchedulerService::GetStatus(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* in,
                                                      grpc::ByteBuffer* out) {
  auto* call = new GetStatusCall(out);
  if (!Begin(metrics::Method::kGetStatus, context, *in, call)) return call;
  v1::GetStatusResponse* response = call->response();
  const RoundCoordinator::Stats stats = coordinator_->GetStats();
  response->set_rank(options_.rank);
  response->set_world_size(stats.world_size);
  response->set_group_ready(stats.group_ready);
  response->set_backend(stats.backend);
  response->set_generation(stats.generation);
  for (const RoundCoordinator::StreamStats& s : stats.streams) {
    v1::StreamStatus* out = response->add_streams();
    out->set_name(s.name);
    out->set_last_round(s.last_round);
    out->set_rounds_completed(s.rounds_completed);
    out->set_rounds_failed(s.rounds_failed);
    out->set_outstanding(s.outstanding);
    out->set_cached(s.cached);
    out->set_last_round_duration_us(absl::ToInt64Microseconds(s.last_duration));
  }
  v1::Counters* counters = response->mutable_counters();
  counters->set_rounds(stats.rounds);
  counters->set_cache_hits(stats.cache_hits);
  counters->set_joined_in_flight(stats.joined_in_flight);
  counters->set_over_cap_parts(stats.over_cap_parts);
  counters->set_over_cap_unavoidable_parts(stats.over_cap_unavoidable_parts);
  counters->set_over_cap_avoidable_parts(stats.over_cap_parts - stats.over_cap_unavoidable_parts);
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [code, count] : errors_by_code_) {
      (*counters->mutable_errors_by_code())[code] = count;
    }
    counters->set_partitions(partitions_);
    counters->set_balance_batches(balance_batches_);
    counters->set_dynamic_cp_plans(dynamic_cp_plans_);
  }
  response->set_build_version(options_.build_version);
  response->set_proto_version(kProtocolVersion);
  response->set_uptime_us(absl::ToInt64Microseconds(absl::Now() - started_));
  Finish(metrics::Method::kGetStatus, context, call, absl::OkStatus());
  return call;
}

}  // namespace packsched::service
