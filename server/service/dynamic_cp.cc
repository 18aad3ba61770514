#include "server/service/dynamic_cp.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/base/fingerprint.h"
#include "server/base/status_macros.h"
#include "server/group/round_record.h"
#include "server/planner/loss_weights.h"
#include "server/planner/options.h"
#include "server/planner/schema.h"
#include "server/service/convert.h"
#include "server/service/field_errors.h"
#include "server/service/request_memory.h"

namespace packsched::service {
namespace {

// Views written between two asks of the caller's stop check.
constexpr int64_t kViewsPerStopCheck = 4096;

}  // namespace

// ToDynamicCpOptions reads the table by rule. The row
//   X(min_cp, 3, Int, int64, min_cp, min_cp, Own, "...")
// expands, through PACKSCHED_FROM_DCP_PROTO, to
//   if (p.min_cp() != 0) o.min_cp = p.min_cp();
#define PACKSCHED_FROM_DCP_Cap(p, o, links, name, Type, member) (o).member = (p).name();
#define PACKSCHED_FROM_DCP_MaxCp PACKSCHED_FROM_DCP_Cap
#define PACKSCHED_FROM_DCP_Nodes PACKSCHED_FROM_DCP_Cap
#define PACKSCHED_FROM_DCP_Int(p, o, links, name, Type, member) \
  if ((p).name() != 0) (o).member = (p).name();
#define PACKSCHED_FROM_DCP_Weight(p, o, links, name, Type, member) \
  if ((p).has_##name()) (o).member = (p).name();
#define PACKSCHED_FROM_DCP_Ratio(p, o, links, name, Type, member) \
  if ((p).has_##name()) (links).member = (p).name();
#define PACKSCHED_FROM_DCP_Bytes(p, o, links, name, Type, member) \
  if ((p).name() != 0) (links).member = (p).name();
#define PACKSCHED_FROM_DCP_Enum(p, o, links, name, Type, member)            \
  if (!v1::Type##_IsValid((p).name())) {                                    \
    return NotKnown("options." #name, (p).name(), v1::Type##_descriptor()); \
  }                                                                         \
  if ((p).name() != 0) (o).member = static_cast<planner::Type>((p).name() - 1);
#define PACKSCHED_FROM_DCP_PROTO(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_FROM_DCP_##Rule(p, o, links, name, Type, member)

absl::StatusOr<planner::DynamicCpOptions> ToDynamicCpOptions(const v1::DynamicCpOptions& p,
                                                             int64_t world_size,
                                                             planner::CpModelLinks& links) {
  planner::DynamicCpOptions o;
  o.ranks = world_size;
  PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_FROM_DCP_PROTO)
  return o;
}

namespace {

// The options applied, back on the wire (the links only with a model). The row
//   X(linear, 7, Weight, int64, cost.linear, cp_linear, Own, "...")
// expands, through PACKSCHED_TO_DCP_PROTO, to
//   p->set_linear(o.cost.linear);
#define PACKSCHED_TO_DCP_INT(p, o, links, model, name, Type, member) (p)->set_##name((o).member);
#define PACKSCHED_TO_DCP_Cap PACKSCHED_TO_DCP_INT
#define PACKSCHED_TO_DCP_Int PACKSCHED_TO_DCP_INT
#define PACKSCHED_TO_DCP_MaxCp PACKSCHED_TO_DCP_INT
#define PACKSCHED_TO_DCP_Nodes PACKSCHED_TO_DCP_INT
#define PACKSCHED_TO_DCP_Weight PACKSCHED_TO_DCP_INT
#define PACKSCHED_TO_DCP_Enum(p, o, links, model, name, Type, member) \
  (p)->set_##name(static_cast<v1::Type>(static_cast<int>((o).member) + 1));
#define PACKSCHED_TO_DCP_LINK(p, o, links, model, name, Type, member) \
  if (model) (p)->set_##name((links).member);
#define PACKSCHED_TO_DCP_Ratio PACKSCHED_TO_DCP_LINK
#define PACKSCHED_TO_DCP_Bytes PACKSCHED_TO_DCP_LINK
#define PACKSCHED_TO_DCP_PROTO(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_TO_DCP_##Rule(p, o, links, model, name, Type, member)

v1::DynamicCpOptions OptionsToProto(const planner::DynamicCpOptions& o,
                                    const planner::CpModelLinks& links, bool model) {
  v1::DynamicCpOptions wire;
  v1::DynamicCpOptions* p = &wire;
  PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_TO_DCP_PROTO)
  return wire;
}

// One 64-bit fingerprint of the plan: every slot's groups, their sequences and offsets.
uint64_t PlanFingerprint(const planner::DynamicCpPlan& plan) {
  uint64_t h = Fingerprint64(static_cast<int64_t>(plan.slots.size()), kFingerprintSeed);
  for (const planner::CpSlotPlan& slot : plan.slots) {
    h = Fingerprint64(static_cast<int64_t>(slot.groups.size()), h);
    for (const planner::CpGroupPlan& g : slot.groups) {
      h = Fingerprint64(g.first_rank, Fingerprint64(g.size, Fingerprint64(g.name, h)));
      h = Fingerprint64(static_cast<int64_t>(g.sequences.size()), h);
      for (const int64_t s : g.sequences) h = Fingerprint64(s, h);
      for (const int32_t c : g.cu_seqlens) h = Fingerprint64(c, h);
    }
  }
  return h;
}

// The planner's message about an option with the option named as its request field
// ("dynamic_cp: cost.micro_batch = -1: ..." -> "dynamic_cp: options.micro_batch_cost = -1: ...").
// The row
//   X(micro_batch_cost, 10, Weight, int64, cost.micro_batch, cp_micro_batch_cost, Own, "...")
// expands, through PACKSCHED_DCP_FIELD_NAME, to
//   {"dynamic_cp: cost.micro_batch = ", "dynamic_cp: options.micro_batch_cost = "},
#define PACKSCHED_DCP_FIELD_NAME(name, number, Rule, Type, member, flag, Owner, help) \
  {"dynamic_cp: " #member " = ", "dynamic_cp: options." #name " = "},

absl::Status OptionAsField(const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(
      s.code(),
      absl::StrReplaceAll(s.message(), {PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_DCP_FIELD_NAME)}));
}

// The request's per-sequence inputs, checked.
absl::Status CheckPerSequence(const v1::PlanDynamicCpRequest& request, int64_t world_size) {
  const int n = request.lengths_size();
  if (!request.owner_ranks().empty()) {
    if (request.owner_ranks_size() != n) {
      return absl::InvalidArgumentError(absl::StrCat("owner_ranks has ", request.owner_ranks_size(),
                                                     " entries for ", n,
                                                     " sequences: must be empty or one per "
                                                     "sequence"));
    }
    for (int i = 0; i < n; ++i) {
      const int64_t owner = request.owner_ranks(i);
      if (owner < 0 || owner >= world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "owner_ranks[", i, "] = ", owner, ": must be in [0, world_size = ", world_size, ")"));
      }
    }
  }
  if (!request.loss_tokens().empty()) {
    if (request.loss_tokens_size() != n) {
      return absl::InvalidArgumentError(absl::StrCat("loss_tokens has ", request.loss_tokens_size(),
                                                     " entries for ", n,
                                                     " sequences: must be empty or one per "
                                                     "sequence"));
    }
    for (int i = 0; i < n; ++i) {
      const int64_t t = request.loss_tokens(i);
      if (t < 0 || t > request.lengths(i)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "loss_tokens[", i, "] = ", t, ": must be in [0, its length ", request.lengths(i), "]"));
      }
    }
  }
  if (request.has_rank() && (request.rank() < 0 || request.rank() >= world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank = ", request.rank(), ": must be in [0, world_size = ", world_size, ") or unset"));
  }
  return absl::OkStatus();
}

// Rank `rank`'s micro-batch in group `g` (slot view), with the owners and the loss weights.
void WriteView(const planner::CpGroupPlan& g, int64_t rank, const std::vector<int64_t>& owners,
               const std::vector<int64_t>& owner_index, const std::vector<double>& weights,
               v1::CpRankSlot* out) {
  out->set_group(g.name);
  out->mutable_ranks()->set_first_rank(g.first_rank);
  out->mutable_ranks()->set_size(g.size);
  const int64_t cp_rank = rank - g.first_rank;
  out->set_cp_rank(cp_rank);
  out->mutable_sequences()->Assign(g.sequences.begin(), g.sequences.end());
  for (const int64_t s : g.sequences) {
    if (!owners.empty()) {
      out->add_owner_ranks(owners[s]);
      out->add_owner_indices(owner_index[s]);
    }
    if (!weights.empty()) out->add_loss_weights(weights[s]);
  }
  out->mutable_cu_seqlens()->Assign(g.cu_seqlens.begin(), g.cu_seqlens.end());
  out->add_shard_chunks(cp_rank);
  out->add_shard_chunks(2 * g.size - 1 - cp_rank);
  out->set_tokens_per_rank(g.tokens_per_rank);
}

// The request's checks, up to planning: the options applied (the model's weights filled in), the
// links and the loss options.
struct CheckedStep {
  planner::DynamicCpOptions options;
  planner::CpModelLinks links;
  planner::LossOptions loss;
};

absl::StatusOr<CheckedStep> CheckStep(const v1::PlanDynamicCpRequest& request,
                                      const ServiceLimits& limits,
                                      const std::vector<int64_t>& lengths) {
  const int64_t world_size = request.world_size();
  if (world_size < 1 || world_size > planner::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size = ", world_size, ": must be in [1, ",
                                                   planner::kMaxWorldSize, "]"));
  }
  if (request.lengths_size() > limits.max_sequences_per_request) {
    return absl::ResourceExhaustedError(absl::StrCat(request.lengths_size(),
                                                     " sequences exceed the server limit "
                                                     "--max_sequences_per_request = ",
                                                     limits.max_sequences_per_request));
  }
  RETURN_IF_ERROR(CheckPerSequence(request, world_size));
  CheckedStep step;
  ASSIGN_OR_RETURN(step.options, ToDynamicCpOptions(request.options(), world_size, step.links));
  // The slot count is a multiple of divisible_by: bounded as a micro-batch count is.
  if (step.options.divisible_by > limits.max_micro_batches) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "options.divisible_by = ", step.options.divisible_by, " slots exceed the server limit --",
        planner::schema::OptionNamed("Ceiling"), " = ", limits.max_micro_batches));
  }
  ASSIGN_OR_RETURN(step.loss, ToLossOptions(request.loss()));
  // The planner lists no more groups than admission reserved for (request_memory.h).
  step.options.max_groups = DynamicCpGroupsReserved(request.lengths_size(), step.options);
  // The options' own errors before the model's (which reads the lengths).
  RETURN_IF_ERROR(OptionAsField(planner::PlanDynamicCp({}, step.options).status()));
  if (request.has_model_config()) {
    const v1::ModelConfig& model = request.model_config();
    const absl::flat_hash_map<std::string, int64_t> ints(model.ints().begin(), model.ints().end());
    const absl::flat_hash_map<std::string, std::string> strings(model.strings().begin(),
                                                                model.strings().end());
    absl::StatusOr<planner::CpCostModel> cost =
        planner::CpCostOfModelFields(ints, strings, lengths, step.options, step.links);
    if (!cost.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model_config: ", cost.status().message()));
    }
    step.options.cost = *cost;
  }
  return step;
}

// `message`'s bytes in deterministic serialization (map entries ordered by key).
std::string DeterministicBytes(const google::protobuf::MessageLite& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializePartialToCodedStream(&coded);
  }
  return bytes;
}

uint64_t FingerprintInts(const google::protobuf::RepeatedField<int64_t>& values, uint64_t h) {
  h = Fingerprint64(static_cast<int64_t>(values.size()), h);
  for (const int64_t v : values) h = Fingerprint64(v, h);
  return h;
}

uint64_t FingerprintMessage(const google::protobuf::MessageLite& message, uint64_t h) {
  const std::string bytes = DeterministicBytes(message);
  return Fingerprint64(bytes, Fingerprint64(static_cast<int64_t>(bytes.size()), h));
}

}  // namespace

uint64_t StepFingerprint(const v1::PlanDynamicCpRequest& request) {
  uint64_t h = Fingerprint64("packsched.v1.PlanDynamicCp step");
  h = Fingerprint64(kProtocolVersion, h);
  h = Fingerprint64(request.world_size(), h);
  h = FingerprintInts(request.lengths(), h);
  h = FingerprintInts(request.owner_ranks(), h);
  h = FingerprintInts(request.loss_tokens(), h);
  h = FingerprintMessage(request.options(), h);
  h = FingerprintMessage(request.loss(), h);
  h = Fingerprint64(int64_t{request.has_model_config()}, h);
  return FingerprintMessage(request.model_config(), h);
}

absl::StatusOr<RoundInput> ToDynamicCpRound(const v1::PlanDynamicCpRequest& request,
                                            const ServiceLimits& limits) {
  if (request.stream().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("round = ", request.round(),
                     " without a stream: name the stream to agree the step, or leave round 0"));
  }
  RETURN_IF_ERROR(ValidateStream(request.stream(), limits));
  RoundInput round;
  round.stream = request.stream();
  round.round = request.round();
  round.agree_only = true;
  round.options_hash = round.content_hash = StepFingerprint(request);
  const std::vector<int64_t> lengths(request.lengths().begin(), request.lengths().end());
  round.error = CheckStep(request, limits, lengths).status();
  return round;
}

absl::Status ExplainStepRound(const absl::Status& status) {
  if (!group::IsOptionsMismatch(status)) return status;
  return absl::FailedPreconditionError(absl::StrCat(
      "PlanDynamicCp: the ranks sent different steps (the step fingerprint covers world_size, "
      "lengths, owner_ranks, loss_tokens, loss, options and model_config; not rank): ",
      status.message()));
}

absl::Status RunPlanDynamicCp(const v1::PlanDynamicCpRequest& request, const ServiceLimits& limits,
                              const std::function<absl::Status()>& stop,
                              const std::function<absl::Status(int64_t bytes)>& reserve,
                              v1::PlanDynamicCpResponse* response) {
  const int64_t world_size = request.world_size();
  const std::vector<int64_t> lengths(request.lengths().begin(), request.lengths().end());
  ASSIGN_OR_RETURN(CheckedStep step, CheckStep(request, limits, lengths));
  const planner::DynamicCpOptions& options = step.options;
  const planner::CpModelLinks& links = step.links;
  const planner::LossOptions& loss = step.loss;
  ASSIGN_OR_RETURN(const planner::DynamicCpPlan plan, planner::PlanDynamicCp(lengths, options));
  const int64_t first_view = request.has_rank() ? request.rank() : 0;
  const int64_t views = request.has_rank() ? 1 : world_size;
  if (reserve) {
    int64_t entries = 0;  // sequence entries over the views written below
    for (const planner::CpSlotPlan& slot : plan.slots) {
      for (const planner::CpGroupPlan& g : slot.groups) {
        const int64_t members = std::min(g.first_rank + g.size, first_view + views) -
                                std::max(g.first_rank, first_view);
        if (members > 0) entries += members * static_cast<int64_t>(g.sequences.size());
      }
    }
    RETURN_IF_ERROR(
        reserve(DynamicCpResponseBytes(views * static_cast<int64_t>(plan.slots.size()), entries)));
  }
  std::vector<double> weights;
  if (!request.loss_tokens().empty()) {
    const std::vector<int64_t> tokens(request.loss_tokens().begin(), request.loss_tokens().end());
    ASSIGN_OR_RETURN(weights, planner::DynamicCpLossWeights(tokens, loss, world_size));
  }
  std::vector<int64_t> owners(request.owner_ranks().begin(), request.owner_ranks().end());
  std::vector<int64_t> owner_index(owners.size());
  {
    std::vector<int64_t> seen(owners.empty() ? 0 : world_size, 0);
    for (size_t s = 0; s < owners.size(); ++s) owner_index[s] = seen[owners[s]]++;
  }

  response->set_num_micro_batches(static_cast<int64_t>(plan.slots.size()));
  for (const auto& [first, size] : plan.group_names) {
    v1::CpGroup* g = response->add_group_names();
    g->set_first_rank(first);
    g->set_size(size);
  }
  response->mutable_cp_of_sequence()->Assign(plan.cp_of_sequence.begin(),
                                             plan.cp_of_sequence.end());
  response->mutable_slot_of_sequence()->Assign(plan.slot_of_sequence.begin(),
                                               plan.slot_of_sequence.end());
  response->set_step_cost(plan.step_cost);
  response->set_lower_bound(plan.lower_bound);
  response->set_comm_tokens(plan.comm_tokens);
  *response->mutable_options() = OptionsToProto(options, links, request.has_model_config());
  response->set_plan_fingerprint(PlanFingerprint(plan));

  std::vector<v1::CpRankView*> out(views);
  for (int64_t v = 0; v < views; ++v) {
    out[v] = response->add_ranks();
    out[v]->set_rank(first_view + v);
  }
  int64_t written = 0;
  for (const planner::CpSlotPlan& slot : plan.slots) {
    for (const planner::CpGroupPlan& g : slot.groups) {
      const int64_t from = std::max(g.first_rank, first_view);
      const int64_t to = std::min(g.first_rank + g.size, first_view + views);
      for (int64_t rank = from; rank < to; ++rank) {
        if (stop && ++written % kViewsPerStopCheck == 0) RETURN_IF_ERROR(stop());
        WriteView(g, rank, owners, owner_index, weights, out[rank - first_view]->add_slots());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace packsched::service
