#include "server/service/forest_convert.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/status_macros.h"

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

absl::StatusOr<planner::Forest> ToForest(const v1::Forest& forest, const ServiceLimits& limits) {
  RETURN_IF_ERROR(WithinLimit("nodes", forest.node_len_size(), limits));
  RETURN_IF_ERROR(WithinLimit("nodes", forest.node_parent_size(), limits));
  RETURN_IF_ERROR(WithinLimit("rollouts", forest.rollout_leaf_size(), limits));
  RETURN_IF_ERROR(WithinLimit("rollouts", forest.rollout_len_size(), limits));
  planner::Forest out{Copy(forest.node_len()), Copy(forest.node_parent()),
                      Copy(forest.rollout_leaf()), Copy(forest.rollout_len())};
  RETURN_IF_ERROR(planner::CheckHasRollouts(out));
  RETURN_IF_ERROR(planner::IndexForest(out).status());
  return out;
}

void TreePlanToProto(const planner::TreePlan& plan, v1::TreePlan* out) {
  for (const planner::TreeMicroBatch& part : plan.parts) {
    const planner::TreeLayout& l = part.layout;
    v1::TreeLayout* layout = out->add_layouts();
    Assign(l.rollouts, layout->mutable_rollouts());
    Assign(l.piece_rollouts, layout->mutable_piece_rollouts());
    Assign(l.piece_rollout_begin, layout->mutable_piece_rollout_begin());
  }
  Assign(plan.rollout_part, out->mutable_rollout_part());
  out->set_forwarded_tokens(plan.forwarded_tokens);
  out->set_rollout_tokens(plan.rollout_tokens);
}

}  // namespace packsched::service
