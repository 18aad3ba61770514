#ifndef PACKSCHED_SERVER_SERVICE_FOREST_CONVERT_H_
#define PACKSCHED_SERVER_SERVICE_FOREST_CONVERT_H_

// Wire <-> planner conversion of tree packing (docs/design.md "Tree packing"): a request's
// Forest, and a tree plan's layout in the response. Pure functions; thread-safe.

#include "absl/status/statusor.h"
#include "packsched/v1/scheduler.pb.h"
#include "server/planner/forest.h"
#include "server/planner/tree_plan.h"
#include "server/service/limits.h"

namespace packsched::service {

// The forest of a request, validated. ResourceExhausted naming --max_sequences_per_request when
// its nodes or its rollouts exceed it (checked before anything is copied); InvalidArgument
// naming the node or rollout for a bad forest (planner::IndexForest), or for one without
// rollouts.
absl::StatusOr<planner::Forest> ToForest(const v1::Forest& forest, const ServiceLimits& limits);

// A tree plan's layouts, rollout_part and token figures into `out`.
void TreePlanToProto(const planner::TreePlan& plan, v1::TreePlan* out);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_FOREST_CONVERT_H_
