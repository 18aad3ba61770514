#include "server/service/scheduler_service.h"

#include <atomic>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "grpcpp/support/message_allocator.h"
#include "server/base/status_macros.h"
#include "server/security/credentials.h"
#include "server/service/convert.h"

namespace packsched::service {
namespace {

constexpr absl::string_view kServedKey = "packsched-served";

// Calls whose messages gRPC holds (from the call's arrival until its response is written), over
// every service of the process: what SchedulerServer::Shutdown waits for.
std::atomic<int64_t> live_calls{0};

// One call's request and response on a protobuf arena: a plan response is a few hundred
// sub-messages and repeated fields (one per micro-batch, three fields each), which the arena
// allocates from a few blocks and frees at once when gRPC releases the call, instead of one
// malloc and one free each. Blocks start at 16 KiB (a 1,024-sequence request is about 16 KiB).
template <typename Request, typename Response>
class ArenaMessages final : public grpc::MessageHolder<Request, Response> {
 public:
  ArenaMessages() : arena_(Options()) {
    this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
    this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
  }
  void Release() override { delete this; }

 private:
  static google::protobuf::ArenaOptions Options() {
    google::protobuf::ArenaOptions options;
    options.start_block_size = 16 << 10;
    options.max_block_size = 256 << 10;
    return options;
  }

  // Counts this call in live_calls while gRPC holds its messages.
  struct Counted {
    Counted() { live_calls.fetch_add(1, std::memory_order_relaxed); }
    ~Counted() { live_calls.fetch_sub(1, std::memory_order_relaxed); }
    Counted(const Counted&) = delete;
    Counted& operator=(const Counted&) = delete;
  };

  Counted counted_;
  google::protobuf::Arena arena_;
};

// Stateless, so one instance serves every call and every service; never destroyed (gRPC
// needs it for the server's lifetime).
template <typename Request, typename Response>
grpc::MessageAllocator<Request, Response>* ArenaAllocator() {
  class Allocator final : public grpc::MessageAllocator<Request, Response> {
   public:
    grpc::MessageHolder<Request, Response>* AllocateMessages() override {
      return new ArenaMessages<Request, Response>();
    }
  };
  static Allocator* const allocator = new Allocator();
  return allocator;
}

// Hands `reservation` to the call's arena when `response` lives on one, so that it ends when
// gRPC frees the call's messages — after the response is written. Otherwise it stays with the
// caller, which holds it until the call is finished.
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
      budget_(options_.limits.max_inflight_bytes) {
  SetMessageAllocatorFor_Plan(ArenaAllocator<v1::PlanRequest, v1::PlanResponse>());
  SetMessageAllocatorFor_Partition(ArenaAllocator<v1::PartitionRequest, v1::PlanResponse>());
  SetMessageAllocatorFor_BalanceBatch(
      ArenaAllocator<v1::BalanceBatchRequest, v1::BalanceBatchResponse>());
}

absl::StatusOr<MemoryBudget::Reservation> SchedulerService::Reserve(const RequestMemory& memory,
                                                                    absl::string_view what) {
  return budget_.Reserve(memory.bytes, absl::StrCat(what, " (n = ", memory.sequences, ", k up to ",
                                                    memory.micro_batches, ", ", memory.wire_bytes,
                                                    " bytes on the wire)"));
}

void SchedulerService::RefuseNewCalls() { refusing_.store(true, std::memory_order_release); }

int64_t SchedulerService::CallsInProgress() { return live_calls.load(std::memory_order_relaxed); }

grpc::ServerUnaryReactor* SchedulerService::RefuseNow(grpc::CallbackServerContext* context) {
  // As gRPC's own refusal once the server has shut down: not marked as served, so clients keep
  // trying to reach their sidecar (its restart) instead of taking this as the round's answer.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the sidecar is shutting down"));
  return reactor;
}

absl::Status SchedulerService::Authorize(const grpc::CallbackServerContext& context) const {
  return security::CheckBearerToken(security::AuthorizationOf(context), options_.auth_token);
}

void SchedulerService::Finish(metrics::Method method, grpc::CallbackServerContext* context,
                              grpc::ServerUnaryReactor* reactor, const absl::Status& status) {
  context->AddTrailingMetadata(std::string(kServedKey), "1");
  if (options_.metrics != nullptr) options_.metrics->Request(method, status.code());
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    ++errors_by_code_[absl::StatusCodeToString(status.code())];
  }
  reactor->Finish(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* SchedulerService::FinishNow(metrics::Method method,
                                                      grpc::CallbackServerContext* context,
                                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Finish(method, context, reactor, status);
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::Plan(grpc::CallbackServerContext* context,
                                                 const v1::PlanRequest* request,
                                                 v1::PlanResponse* response) {
  if (refusing_.load(std::memory_order_acquire)) return RefuseNow(context);
  if (absl::Status auth = Authorize(*context); !auth.ok())
    return FinishNow(metrics::Method::kPlan, context, auth);
  absl::StatusOr<RoundInput> input = ToRoundInput(*request, options_.limits);
  if (!input.ok()) return FinishNow(metrics::Method::kPlan, context, input.status());
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
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  coordinator_->Submit(*std::move(input),
                       [this, context, reactor, response, held = std::move(reservation)](
                           absl::StatusOr<std::shared_ptr<const RoundResult>> result) {
                         if (result.ok()) RoundResultToProto(**result, response);
                         Finish(metrics::Method::kPlan, context, reactor, result.status());
                       });
  return reactor;
}

grpc::ServerUnaryReactor* SchedulerService::Partition(grpc::CallbackServerContext* context,
                                                      const v1::PartitionRequest* request,
                                                      v1::PlanResponse* response) {
  if (refusing_.load(std::memory_order_acquire)) return RefuseNow(context);
  absl::Status status = Authorize(*context);
  std::optional<MemoryBudget::Reservation> reservation;
  if (status.ok()) {
    absl::StatusOr<MemoryBudget::Reservation> reserved =
        Reserve(EstimatePartitionMemory(*request, options_.limits), "this Partition request");
    if (reserved.ok()) {
      reservation = *std::move(reserved);
    } else {
      status = reserved.status();
    }
  }
  HoldUntilFreed(response, &reservation);
  if (status.ok()) status = RunPartition(*request, options_.limits, response);
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    ++partitions_;
  }
  return FinishNow(metrics::Method::kPartition, context, status);
}

grpc::ServerUnaryReactor* SchedulerService::BalanceBatch(grpc::CallbackServerContext* context,
                                                         const v1::BalanceBatchRequest* request,
                                                         v1::BalanceBatchResponse* response) {
  if (refusing_.load(std::memory_order_acquire)) return RefuseNow(context);
  absl::Status status = Authorize(*context);
  std::optional<MemoryBudget::Reservation> reservation;
  if (status.ok()) {
    absl::StatusOr<MemoryBudget::Reservation> reserved =
        Reserve(EstimateBalanceBatchMemory(*request, options_.limits), "this BalanceBatch request");
    if (reserved.ok()) {
      reservation = *std::move(reserved);
    } else {
      status = reserved.status();
    }
  }
  HoldUntilFreed(response, &reservation);
  if (status.ok()) status = RunBalanceBatch(*request, options_.limits, response);
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    ++balance_batches_;
  }
  return FinishNow(metrics::Method::kBalanceBatch, context, status);
}

grpc::ServerUnaryReactor* SchedulerService::GetStatus(grpc::CallbackServerContext* context,
                                                      const v1::GetStatusRequest* request,
                                                      v1::GetStatusResponse* response) {
  if (refusing_.load(std::memory_order_acquire)) return RefuseNow(context);
  if (absl::Status auth = Authorize(*context); !auth.ok())
    return FinishNow(metrics::Method::kGetStatus, context, auth);
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
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [code, count] : errors_by_code_) {
      (*counters->mutable_errors_by_code())[code] = count;
    }
    counters->set_partitions(partitions_);
    counters->set_balance_batches(balance_batches_);
  }
  response->set_build_version(options_.build_version);
  response->set_proto_version(kProtocolVersion);
  response->set_uptime_us(absl::ToInt64Microseconds(absl::Now() - started_));
  return FinishNow(metrics::Method::kGetStatus, context, absl::OkStatus());
}

}  // namespace packsched::service
