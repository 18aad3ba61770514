#include "server/service/forest_convert.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/status_macros.h"
#include "server/planner/schema.h"

namespace packsched::service {
namespace {

absl::Status WithinLimit(absl::string_view what, int64_t count, const ServiceLimits& limits) {
  if (count <= limits.max_sequences_per_request) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("forest: ", count, " ", what,
                                                   " exceed the server limit "
                                                   "--max_sequences_per_request = ",
                                                   limits.max_sequences_per_request));
}

template <typename Field>
std::vector<int64_t> Copy(const Field& field) {
  return std::vector<int64_t>(field.begin(), field.end());
}

void Assign(const std::vector<int64_t>& values, google::protobuf::RepeatedField<int64_t>* out) {
  out->Assign(values.begin(), values.end());
}

}  // namespace

// A forest request's arrays (PACKSCHED_FOREST) into the planner's, each within the server's
// limit. The row
//   X(node_len, 1, Nodes)
// expands, through PACKSCHED_FOREST_LIMIT and PACKSCHED_FOREST_COPY, to
//   RETURN_IF_ERROR(WithinLimit("nodes", forest.node_len_size(), limits));
//   out.node_len = Copy(forest.node_len());
#define PACKSCHED_FOREST_LIMIT_Nodes(forest, limits, name) \
  RETURN_IF_ERROR(WithinLimit("nodes", (forest).name##_size(), limits));
#define PACKSCHED_FOREST_LIMIT_Rollouts(forest, limits, name) \
  RETURN_IF_ERROR(WithinLimit("rollouts", (forest).name##_size(), limits));
#define PACKSCHED_FOREST_LIMIT_Checked PACKSCHED_FOREST_LIMIT_Rollouts
#define PACKSCHED_FOREST_LIMIT(name, number, Kind) \
  PACKSCHED_FOREST_LIMIT_##Kind(forest, limits, name)
#define PACKSCHED_FOREST_COPY(name, number, Kind) out.name = Copy(forest.name());

absl::StatusOr<planner::Forest> ToForest(const v1::Forest& forest, const ServiceLimits& limits) {
  PACKSCHED_FOREST(PACKSCHED_FOREST_LIMIT)
  planner::Forest out;
  PACKSCHED_FOREST(PACKSCHED_FOREST_COPY)
  RETURN_IF_ERROR(planner::CheckHasRollouts(out));
  RETURN_IF_ERROR(planner::IndexForest(out).status());
  return out;
}

// A tree plan (PACKSCHED_TREE_PLAN, each micro-batch's PACKSCHED_TREE_LAYOUT) into its message.
// The rows
//   X(rollout_part, 2, Ints)   X(forwarded_tokens, 3, Int)   X(rollouts, 7, Ints)
// expand, through PACKSCHED_TREE_TO_PROTO and PACKSCHED_LAYOUT_TO_PROTO, to
//   Assign(plan.rollout_part, out->mutable_rollout_part());
//   out->set_forwarded_tokens(plan.forwarded_tokens);
//   Assign(l.rollouts, layout->mutable_rollouts());   (in the loop over the micro-batches)
#define PACKSCHED_LAYOUT_TO_PROTO(name, number, Kind) Assign(l.name, layout->mutable_##name());
#define PACKSCHED_TREE_TO_PROTO_Layouts(plan, out, name)     \
  for (const planner::TreeMicroBatch& part : (plan).parts) { \
    const planner::TreeLayout& l = part.layout;              \
    v1::TreeLayout* layout = (out)->add_##name();            \
    PACKSCHED_TREE_LAYOUT(PACKSCHED_LAYOUT_TO_PROTO)         \
  }
#define PACKSCHED_TREE_TO_PROTO_Ints(plan, out, name) Assign((plan).name, (out)->mutable_##name());
#define PACKSCHED_TREE_TO_PROTO_Int(plan, out, name) (out)->set_##name((plan).name);
#define PACKSCHED_TREE_TO_PROTO(name, number, Kind) PACKSCHED_TREE_TO_PROTO_##Kind(plan, out, name)

void TreePlanToProto(const planner::TreePlan& plan, v1::TreePlan* out) {
  PACKSCHED_TREE_PLAN(PACKSCHED_TREE_TO_PROTO)
}

}  // namespace packsched::service
