#include "server/service/partition.h"

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/base/status_macros.h"
#include "server/planner/loss_weights.h"
#include "server/planner/planner.h"
#include "server/planner/schema.h"
#include "server/service/convert.h"
#include "server/service/field_errors.h"

namespace packsched::service {

absl::Status RunPartition(const v1::PartitionRequest& request, const ServiceLimits& limits,
                          v1::PlanResponse* response) {
  ASSIGN_OR_RETURN(PlanInput input,
                   MakePlanInput(request.lengths(), request.options(), request.loss_tokens(),
                                 request.loss(), limits, /*planner_picks_k=*/false));
  const int64_t k = request.num_micro_batches();
  if (k < 1 || k > input.options.max_micro_batches) {
    return absl::InvalidArgumentError(absl::StrCat("num_micro_batches = ", k, ": must be in [1, ",
                                                   input.options.max_micro_batches, "]"));
  }
  // The caller's global counts (PACKSCHED_GLOBAL_COUNTS): Kept 0 = this request's own, Loss
  // counts >= 0, World in [0, kMaxWorldSize] (0 = 1).
  const v1::GlobalCounts& g = request.global();
  int64_t ranks = 1;
#define PACKSCHED_CHECK_Kept(name)
#define PACKSCHED_CHECK_Loss(name) \
  if (g.name() < 0) return Negative("global." #name, g.name());
#define PACKSCHED_CHECK_World(name)                                                             \
  if (g.name() < 0 || g.name() > planner::kMaxWorldSize) {                                      \
    return absl::InvalidArgumentError(absl::StrCat("global." #name " = ", g.name(),             \
                                                   ": must be in [0, ", planner::kMaxWorldSize, \
                                                   "] (0 = 1)"));                               \
  }                                                                                             \
  ranks = g.name() == 0 ? 1 : g.name();
#define PACKSCHED_CHECK(name, number, Kind) PACKSCHED_CHECK_##Kind(name)
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_CHECK)
  ASSIGN_OR_RETURN(planner::MicroBatchPlan plan,
                   planner::PartitionFixedK(input.lengths, k, input.options));
  std::optional<planner::LossWeights> weights;
  // Global counts sum every rank's, this one's included: one below this request's own is a
  // caller's mistake (e.g. `global` set for the world size alone) that would silently scale or
  // zero every weight.
  auto at_least_own = [](absl::string_view field, int64_t global, int64_t own) -> absl::Status {
    if (global >= own) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", global, " is below this request's own ", own,
                     ": global counts are summed over every rank, this one included"));
  };
  v1::GlobalCounts* out = response->mutable_global();
  // Kept: the caller's count when set, else this request's (the plan's kept sequences).
#define PACKSCHED_KEPT_Kept(name)                                       \
  const int64_t own_kept = plan.stats.num_kept;                         \
  if (request.has_global() && g.name() > 0) {                           \
    RETURN_IF_ERROR(at_least_own("global." #name, g.name(), own_kept)); \
  }                                                                     \
  out->set_##name(request.has_global() && g.name() > 0 ? g.name() : own_kept);
#define PACKSCHED_KEPT_Loss(name)
#define PACKSCHED_KEPT_World(name) out->set_##name(ranks);
#define PACKSCHED_OWN_KEPT(name, number, Kind) PACKSCHED_KEPT_##Kind(name)
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_OWN_KEPT)
  if (input.loss_tokens) {
    ASSIGN_OR_RETURN(planner::LossCounts counts, planner::CountLoss(plan, *input.loss_tokens));
    if (request.has_global()) {
#define PACKSCHED_OWN_Loss(name) \
  RETURN_IF_ERROR(at_least_own("global." #name, g.name(), counts.name));
#define PACKSCHED_OWN_Kept(name)
#define PACKSCHED_OWN_World(name)
#define PACKSCHED_OWN(name, number, Kind) PACKSCHED_OWN_##Kind(name)
      PACKSCHED_GLOBAL_COUNTS(PACKSCHED_OWN)
#define PACKSCHED_TAKE_Loss(name) counts.name = g.name();
#define PACKSCHED_TAKE_Kept(name)
#define PACKSCHED_TAKE_World(name)
#define PACKSCHED_TAKE(name, number, Kind) PACKSCHED_TAKE_##Kind(name)
      PACKSCHED_GLOBAL_COUNTS(PACKSCHED_TAKE)
    }
    ASSIGN_OR_RETURN(
        weights, planner::ComputeLossWeights(plan, *input.loss_tokens, input.loss, counts, ranks));
#define PACKSCHED_SET_Loss(name) out->set_##name(counts.name);
#define PACKSCHED_SET_Kept(name)
#define PACKSCHED_SET_World(name)
#define PACKSCHED_SET(name, number, Kind) PACKSCHED_SET_##Kind(name)
    PACKSCHED_GLOBAL_COUNTS(PACKSCHED_SET)
  }
  PlanResponseHead(k, plan, response);
  PlanToProto(plan, weights ? &*weights : nullptr, input.options.max_token_len, response);
  return absl::OkStatus();
}

}  // namespace packsched::service
