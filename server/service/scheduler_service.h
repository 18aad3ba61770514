#ifndef PACKSCHED_SERVER_SERVICE_SCHEDULER_SERVICE_H_
#define PACKSCHED_SERVER_SERVICE_SCHEDULER_SERVICE_H_

// packsched.v1.Scheduler over gRPC's callback API: a thin adapter. Its methods are gRPC's raw
// ones: each call parses its own request (service_call.h: a body that does not parse is
// INVALID_ARGUMENT naming the message), reserves its memory estimate (request_memory.h),
// converts it (convert.h), hands rounds to the coordinator
// (which finishes the reactor from the stream's worker thread, or — with inline rounds enabled, a
// small round of a group of one on an idle stream — runs it and finishes it inline, before Plan
// returns) or hands Partition, BalanceBatch and PlanDynamicCp to the service's own planning
// workers (work_pool.h; partition.h, balance_batch.h, dynamic_cp.h), and turns absl::Status into
// grpc::Status — the only place that happens. Nothing here blocks a gRPC thread: inline rounds are
// small, and the heavy requests run on the workers, so health checks and Plan keep their threads.
// BalanceBatch stops planning at the caller's deadline (DEADLINE_EXCEEDED), when the caller cancels
// (CANCELLED) and at StopPlanning() (UNAVAILABLE, unmarked, as a refused call).

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "packsched/v1/scheduler.grpc.pb.h"
#include "server/metrics/sink.h"
#include "server/service/coordinator.h"
#include "server/service/limits.h"
#include "server/service/memory_budget.h"
#include "server/service/request_memory.h"
#include "server/service/service_call.h"
#include "server/service/work_pool.h"

namespace packsched::service {

// absl -> gRPC status, code for code (the two enums share values), message kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

class SchedulerService final : public v1::Scheduler::WithRawCallbackMethod_Plan<
                                   v1::Scheduler::WithRawCallbackMethod_Partition<
                                       v1::Scheduler::WithRawCallbackMethod_BalanceBatch<
                                           v1::Scheduler::WithRawCallbackMethod_GetStatus<
                                               v1::Scheduler::WithRawCallbackMethod_PlanDynamicCp<
                                                   v1::Scheduler::Service>>>>> {
 public:
  struct Options {
    ServiceLimits limits;
    // When not empty, every call must carry "authorization: Bearer <auth_token>"
    // (UNAUTHENTICATED otherwise).
    std::string auth_token;
    int64_t rank = 0;
    std::string build_version;
    // Where every answered call is counted by method and code (server/metrics/sink.h); not
    // owned, outlives the service. Null: metrics off.
    metrics::Sink* metrics = nullptr;
    // The planning workers (work_pool.h): threads >= 1; at most planning_queue requests wait.
    int64_t planning_threads = 1;
    int64_t planning_queue = 8;
  };

  // `coordinator` must outlive the service; the service must outlive the grpc::Server.
  SchedulerService(RoundCoordinator* coordinator, Options options);

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* context, const grpc::ByteBuffer* in,
                                 grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* Partition(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* BalanceBatch(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* in,
                                         grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* in, grpc::ByteBuffer* out) override;
  grpc::ServerUnaryReactor* PlanDynamicCp(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) override;

  // From now on every new call is refused with UNAVAILABLE, not marked as served (clients keep
  // trying to reach their sidecar, as when gRPC itself refuses them): the first step of a
  // shutdown (server.h). Calls already in progress are unaffected. Thread-safe.
  void RefuseNewCalls();
  // Planning in progress stops at its next check and every queued heavy request ends at once
  // (UNAVAILABLE, not marked as served); later ones are refused. The second step of a shutdown.
  // Thread-safe.
  void StopPlanning();
  // OK when every planning worker asked for (Options::planning_threads) could be started;
  // otherwise ResourceExhausted naming --planning_threads and the system's reason.
  absl::Status PlanningStarted() const;
  // Calls of this process not yet done: from their arrival until their response has been
  // written (service_call.h). Thread-safe.
  static int64_t CallsInProgress();

 private:
  absl::Status Authorize(const grpc::CallbackServerContext& context) const;
  // The start of every call: refuses it while shutting down (UNAVAILABLE, unmarked), checks the
  // bearer token and parses the request into `call` (service_call.h). Returns false if the call
  // has been answered here (the handler just returns it to gRPC).
  template <typename Call>
  bool Begin(metrics::Method method, grpc::CallbackServerContext* context,
             const grpc::ByteBuffer& in, Call* call);
  // Counts `status`, marks the answer as the sidecar's own (trailing metadata
  // "packsched-served", so clients never retry it) and answers `call` with it.
  void Finish(metrics::Method method, grpc::CallbackServerContext* context, ServiceCall* call,
              const absl::Status& status);
  // The request's estimated peak from the in-flight budget (--max_inflight_bytes), or
  // ResourceExhausted naming the estimate and the budget.
  absl::StatusOr<MemoryBudget::Reservation> Reserve(const RequestMemory& memory,
                                                    absl::string_view what);
  // Runs `work` (the request's planning; `stop` is BalanceOptions::stop's answer for this call)
  // on a planning worker and finishes `call` with its status, counting a success in `*done`;
  // refuses it at once when the workers are busy and the queue is full.
  void RunOnWorker(
      metrics::Method method, grpc::CallbackServerContext* context, ServiceCall* call,
      absl::AnyInvocable<absl::Status(const std::function<absl::Status()>& stop) &&> work,
      int64_t* done);

  RoundCoordinator* const coordinator_;
  const Options options_;
  const absl::Time started_ = absl::Now();
  MemoryBudget budget_;
  std::atomic<bool> refusing_{false};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> errors_by_code_ ABSL_GUARDED_BY(mu_);
  int64_t partitions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t balance_batches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dynamic_cp_plans_ ABSL_GUARDED_BY(mu_) = 0;
  // Last: its destructor joins the workers before anything they use goes.
  WorkPool planning_;
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_SCHEDULER_SERVICE_H_
