// libFuzzer target (clang builds only, not run by the test command): arbitrary bytes as a Plan,
// Partition, BalanceBatch or PlanDynamicCp request. Validation and planning must never crash, and
// must answer OK, InvalidArgument or ResourceExhausted. A PlanDynamicCp request goes through
// admission as a sidecar with a 64 MiB budget runs it (request_memory.h).
//
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DPACKSCHED_WITH_CUDA=OFF \
//     -DPACKSCHED_WITH_PYTHON=OFF -DPACKSCHED_SANITIZE=address,undefined \
//     -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link
//   cmake --build build-fuzz --target service_validation_fuzzer
//   build-fuzz/bin/service_validation_fuzzer -max_total_time=60

#include <cstdint>
#include <cstdlib>

#include "server/planner/planner.h"
#include "server/service/balance_batch.h"
#include "server/service/convert.h"
#include "server/service/dynamic_cp.h"
#include "server/service/partition.h"
#include "server/service/request_memory.h"

namespace {

using packsched::service::ServiceLimits;

void Check(const absl::Status& status) {
  if (!status.ok() && !absl::IsInvalidArgument(status) && !absl::IsResourceExhausted(status)) {
    std::abort();
  }
}

ServiceLimits Limits() {
  ServiceLimits limits;
  limits.max_sequences_per_request = 4096;
  limits.max_micro_batches = 4096;
  return limits;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  namespace v1 = packsched::v1;
  namespace service = packsched::service;
  namespace planner = packsched::planner;
  static const ServiceLimits limits = Limits();
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      v1::PlanRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      Check(service::ToRoundInput(request, limits).status());
      const absl::StatusOr<service::PlanInput> input = service::ToPlanInput(request, limits);
      Check(input.status());
      if (!input.ok()) return 0;
      const absl::StatusOr<planner::Problem> problem =
          planner::Problem::Create(input->lengths, input->options);
      if (!problem.ok()) {
        if (!absl::IsInvalidArgument(problem.status())) std::abort();
        return 0;
      }
      const absl::StatusOr<planner::MicroBatchPlan> plan = problem->Partition(problem->local_k());
      if (!plan.ok()) std::abort();
      if (input->loss_tokens) {
        const absl::StatusOr<planner::LossCounts> counts =
            planner::CountLoss(*plan, *input->loss_tokens);
        if (!counts.ok()) std::abort();
        if (!planner::ComputeLossWeights(*plan, *input->loss_tokens, input->loss, *counts, 1)
                 .ok()) {
          std::abort();
        }
      }
      return 0;
    }
    case 1: {
      v1::PartitionRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      v1::PlanResponse response;
      Check(service::RunPartition(request, limits, &response));
      return 0;
    }
    case 3: {
      v1::PlanDynamicCpRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      Check(service::ToDynamicCpRound(request, limits).status());
      constexpr int64_t kBudget = int64_t{64} << 20;
      const int64_t estimate = service::EstimateDynamicCpMemory(request, limits).bytes;
      if (estimate > kBudget) return 0;  // refused before planning
      v1::PlanDynamicCpResponse response;
      Check(service::RunPlanDynamicCp(
          request, limits, /*stop=*/{},
          [&](int64_t views) {
            return estimate + views > kBudget ? absl::ResourceExhaustedError("over the budget")
                                              : absl::OkStatus();
          },
          &response));
      return 0;
    }
    default: {
      v1::BalanceBatchRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      v1::BalanceBatchResponse response;
      Check(service::RunBalanceBatch(request, limits, /*stop=*/{}, &response));
      return 0;
    }
  }
}
