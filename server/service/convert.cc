#include "server/service/convert.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/fingerprint.h"
#include "server/base/status_macros.h"
#include "server/planner/schema.h"
#include "server/service/field_errors.h"
#include "server/service/options_hash.h"

namespace packsched::service {
namespace {

// 0 means `fallback`; negative is InvalidArgument.
absl::StatusOr<int64_t> OrDefault(absl::string_view field, int64_t value, int64_t fallback) {
  if (value < 0) return Negative(field, value);
  return value == 0 ? fallback : value;
}

absl::Status AtMost(absl::string_view field, int64_t value, absl::string_view bound_name,
                    int64_t bound) {
  if (value <= bound) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, ": must be at most ", bound_name, " = ", bound));
}

absl::Status SequenceLimit(absl::string_view field, int64_t count, const ServiceLimits& limits) {
  if (count <= limits.max_sequences_per_request) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(field, ": ", count,
                                                   " sequences exceed the server limit "
                                                   "--max_sequences_per_request = ",
                                                   limits.max_sequences_per_request));
}

// Lengths: count within the limit (checked before copying), non-empty, each >= 1.
absl::StatusOr<std::vector<int64_t>> ToLengths(
    const google::protobuf::RepeatedField<int64_t>& lengths, const ServiceLimits& limits) {
  RETURN_IF_ERROR(SequenceLimit("lengths", lengths.size(), limits));
  if (lengths.empty()) return absl::InvalidArgumentError("lengths is empty: nothing to plan");
  for (int i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1 || lengths[i] > planner::kMaxLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lengths[", i, "] = ", lengths[i], ": must be in [1, ", planner::kMaxLength, "]"));
    }
  }
  return std::vector<int64_t>(lengths.begin(), lengths.end());
}

// loss_tokens: empty (none) or one per sequence, each in [0, its length].
absl::StatusOr<std::optional<std::vector<int64_t>>> ToLossTokens(
    const google::protobuf::RepeatedField<int64_t>& loss_tokens,
    const std::vector<int64_t>& lengths) {
  if (loss_tokens.empty()) return std::optional<std::vector<int64_t>>();
  if (static_cast<size_t>(loss_tokens.size()) != lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat("loss_tokens has ", loss_tokens.size(),
                                                   " entries for ", lengths.size(),
                                                   " sequences: must be empty or one per "
                                                   "sequence"));
  }
  for (int i = 0; i < loss_tokens.size(); ++i) {
    if (loss_tokens[i] < 0 || loss_tokens[i] > lengths[i]) {
      return absl::InvalidArgumentError(absl::StrCat("loss_tokens[", i, "] = ", loss_tokens[i],
                                                     ": must be in [0, lengths[", i,
                                                     "] = ", lengths[i], "]"));
    }
  }
  return std::optional<std::vector<int64_t>>(
      std::vector<int64_t>(loss_tokens.begin(), loss_tokens.end()));
}

// The round's options of PlanOptions (PACKSCHED_ROUND_OPTIONS) into `out`, defaults applied.
void ReadRoundOptions(const v1::PlanOptions& p, PlanInput* out) {
#define PACKSCHED_READ_ROUND(name, number, dflt) out->name = p.has_##name() ? p.name() : (dflt);
  PACKSCHED_ROUND_OPTIONS(PACKSCHED_READ_ROUND)
#undef PACKSCHED_READ_ROUND
}

}  // namespace

absl::StatusOr<PlanInput> MakePlanInput(const google::protobuf::RepeatedField<int64_t>& lengths,
                                        const v1::PlanOptions& options,
                                        const google::protobuf::RepeatedField<int64_t>& loss_tokens,
                                        const v1::LossOptions& loss, const ServiceLimits& limits,
                                        bool planner_picks_k) {
  PlanInput input;
  // Options first: they are small, and bound everything sized by them.
  ASSIGN_OR_RETURN(input.options, ToPlanOptions(options, limits, planner_picks_k));
  ASSIGN_OR_RETURN(input.loss, ToLossOptions(loss));
  ReadRoundOptions(options, &input);
  ASSIGN_OR_RETURN(input.lengths, ToLengths(lengths, limits));
  ASSIGN_OR_RETURN(input.loss_tokens, ToLossTokens(loss_tokens, input.lengths));
  input.options_hash = OptionsHash(input.options, input, input.loss_tokens.has_value(), input.loss);
  input.content_hash = absl::HashOf(
      input.options_hash, absl::MakeConstSpan(input.lengths),
      input.loss_tokens ? absl::MakeConstSpan(*input.loss_tokens) : absl::Span<const int64_t>(),
      input.loss_tokens.has_value());
  return input;
}

absl::Status ValidateStream(absl::string_view stream, const ServiceLimits& limits) {
  if (stream.empty()) return absl::InvalidArgumentError("stream is empty: name the stream");
  if (static_cast<int64_t>(stream.size()) > limits.max_stream_name) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream is ", stream.size(), " bytes long: at most ", limits.max_stream_name));
  }
  for (size_t i = 0; i < stream.size(); ++i) {
    const unsigned char c = stream[i];
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat("stream has byte ", static_cast<int>(c),
                                                     " at position ", i,
                                                     ": only printable ASCII without spaces"));
    }
  }
  return absl::OkStatus();
}

// One macro per rule of PACKSCHED_PLAN_OPTIONS (server/planner/schema.h): reads `p.name()` into
// `o.member`, checked, with errors naming "options.<name>" and the value. The table's rows run
// in proto order; the Ceiling field is read first by the first field bounded by it, and the
// Weight fields' signs are checked together before their bounds (the order of the checks, hence
// of the errors, predates the table).
#define PACKSCHED_READ_Cap(name, Type, member)                                           \
  {                                                                                      \
    o.member = p.name();                                                                 \
    if (o.member < 0 || (planner_picks_k && o.member < 1)) {                             \
      return absl::InvalidArgumentError(absl::StrCat(                                    \
          "options." #name " = ", o.member,                                              \
          planner_picks_k ? ": must be >= 1 (tokens)" : ": must be >= 0 (0 = no cap)")); \
    }                                                                                    \
    RETURN_IF_ERROR(                                                                     \
        AtMost("options." #name, o.member, "the largest length", planner::kMaxLength));  \
  }
#define PACKSCHED_READ_Enum(name, Type, member)                                                    \
  {                                                                                                \
    const int value = p.name();                                                                    \
    if (!v1::Type##_IsValid(value)) {                                                              \
      return NotKnown("options." #name, value, v1::Type##_descriptor());                           \
    }                                                                                              \
    o.member = value == 0 ? planner::PlanOptions{}.member : static_cast<planner::Type>(value - 1); \
  }
#define PACKSCHED_READ_Unlimited(name, Type, member)               \
  {                                                                \
    if (p.name() < 0) return Negative("options." #name, p.name()); \
    o.member = p.name();                                           \
  }
#define PACKSCHED_READ_Count(name, Type, member)                                \
  {                                                                             \
    RETURN_IF_ERROR(read_ceiling());                                            \
    ASSIGN_OR_RETURN(o.member, OrDefault("options." #name, p.name(), 1));       \
    RETURN_IF_ERROR(AtMost("options." #name, o.member, kCeilingName, ceiling)); \
  }
#define PACKSCHED_READ_Align(name, Type, member)                                          \
  {                                                                                       \
    ASSIGN_OR_RETURN(o.member, OrDefault("options." #name, p.name(), 1));                 \
    RETURN_IF_ERROR(AtMost("options." #name, o.member, "the limit", planner::kMaxAlign)); \
  }
#define PACKSCHED_READ_Weight(name, Type, member)                                       \
  {                                                                                     \
    RETURN_IF_ERROR(read_weights());                                                    \
    RETURN_IF_ERROR(                                                                    \
        AtMost("options." #name, o.member, "the limit", planner::kMaxAttentionWeight)); \
  }
#define PACKSCHED_READ_Ceiling(name, Type, member) RETURN_IF_ERROR(read_ceiling());
// equal_size gives n / k sequences per micro-batch for a k the caller fixes. Where the planner
// picks k it would ignore the cap, and a k agreed by the ranks need not divide this rank's n:
// the round would fail after agreement.
#define PACKSCHED_READ_FixedK(name, Type, member)                              \
  {                                                                            \
    if (p.name() && planner_picks_k) {                                         \
      return absl::InvalidArgumentError(                                       \
          "options." #name                                                     \
          " = true applies to Partition only (a micro-batch count the caller " \
          "fixes); Plan and BalanceBatch choose the count under the cap");     \
    }                                                                          \
    o.member = p.name();                                                       \
  }
// The ceiling: 0 = the server's limit, which it may not exceed (the server flag of the same name).
#define PACKSCHED_CEILING_Ceiling(name, Type, member)                                              \
  {                                                                                                \
    ASSIGN_OR_RETURN(o.member, OrDefault("options." #name, p.name(), limits.max_micro_batches));   \
    if (o.member > limits.max_micro_batches) {                                                     \
      return absl::ResourceExhaustedError(absl::StrCat("options." #name " = ", o.member,           \
                                                       " exceeds the server limit --" #name " = ", \
                                                       limits.max_micro_batches));                 \
    }                                                                                              \
    ceiling = o.member;                                                                            \
  }
#define PACKSCHED_CEILING_NAME_Ceiling(name, Type, member) #name
#define PACKSCHED_WEIGHT_Weight(name, Type, member)                     \
  o.member = p.has_##name() ? p.name() : planner::PlanOptions{}.member; \
  if (o.member < 0) return Negative("options." #name, o.member);
#define PACKSCHED_CEILING_Cap PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_Enum PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_Unlimited PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_Count PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_Align PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_Weight PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_FixedK PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_NAME_Cap PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_NAME_Enum PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_NAME_Unlimited PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_NAME_Count PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_NAME_Align PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_NAME_Weight PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_CEILING_NAME_FixedK PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_WEIGHT_Cap PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_WEIGHT_Enum PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_WEIGHT_Unlimited PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_WEIGHT_Count PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_WEIGHT_Align PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_WEIGHT_Ceiling PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_WEIGHT_FixedK PACKSCHED_SCHEMA_NOTHING

#define PACKSCHED_READ(name, number, Rule, Type, member, json, help) \
  PACKSCHED_READ_##Rule(name, Type, member)
#define PACKSCHED_READ_CEILING(name, number, Rule, Type, member, json, help) \
  PACKSCHED_CEILING_##Rule(name, Type, member)
#define PACKSCHED_CEILING_NAME(name, number, Rule, Type, member, json, help) \
  PACKSCHED_CEILING_NAME_##Rule(name, Type, member)
#define PACKSCHED_WEIGHT(name, number, Rule, Type, member, json, help) \
  PACKSCHED_WEIGHT_##Rule(name, Type, member)

absl::StatusOr<planner::PlanOptions> ToPlanOptions(const v1::PlanOptions& p,
                                                   const ServiceLimits& limits,
                                                   bool planner_picks_k) {
  static constexpr absl::string_view kCeilingName =
      "" PACKSCHED_PLAN_OPTIONS(PACKSCHED_CEILING_NAME);
  planner::PlanOptions o;
  // The ceiling comes before the fields it bounds: a huge min_micro_batches or divisible_by is
  // rejected here, before the planner sizes anything by it.
  bool ceiling_read = false;
  int64_t ceiling = 0;
  auto read_ceiling = [&]() -> absl::Status {
    if (ceiling_read) return absl::OkStatus();
    ceiling_read = true;
    PACKSCHED_PLAN_OPTIONS(PACKSCHED_READ_CEILING)
    return absl::OkStatus();
  };
  bool weights_read = false;
  auto read_weights = [&]() -> absl::Status {
    if (weights_read) return absl::OkStatus();
    weights_read = true;
    PACKSCHED_PLAN_OPTIONS(PACKSCHED_WEIGHT)
    return absl::OkStatus();
  };
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_READ)
  return o;
}

// PACKSCHED_LOSS_OPTIONS' rules, as above ("loss.<name>").
#define PACKSCHED_READ_LOSS_Enum(name, Type, member)                                               \
  {                                                                                                \
    const int value = p.name();                                                                    \
    if (!v1::Type##_IsValid(value)) {                                                              \
      return NotKnown("loss." #name, value, v1::Type##_descriptor());                              \
    }                                                                                              \
    o.member = value == 0 ? planner::LossOptions{}.member : static_cast<planner::Type>(value - 1); \
  }
#define PACKSCHED_READ_LOSS_SumNorm(name, Type, member)                                 \
  if (o.mode == planner::LossMode::kSumNorm) {                                          \
    const double c = p.name();                                                          \
    if (!std::isfinite(c) || c <= 0) {                                                  \
      return absl::InvalidArgumentError(absl::StrCat(                                   \
          "loss." #name " = ", c, ": loss mode sum_norm needs a finite constant > 0")); \
    }                                                                                   \
    o.member = c;                                                                       \
  }
#define PACKSCHED_READ_LOSS(name, number, Rule, Type, member, key) \
  PACKSCHED_READ_LOSS_##Rule(name, Type, member)

absl::StatusOr<planner::LossOptions> ToLossOptions(const v1::LossOptions& p) {
  planner::LossOptions o;
  PACKSCHED_LOSS_OPTIONS(PACKSCHED_READ_LOSS)
  return o;
}

absl::StatusOr<PlanInput> ToPlanInput(const v1::PlanRequest& request, const ServiceLimits& limits) {
  return MakePlanInput(request.lengths(), request.options(), request.loss_tokens(), request.loss(),
                       limits, /*planner_picks_k=*/true);
}

absl::StatusOr<RoundInput> ToRoundInput(const v1::PlanRequest& request,
                                        const ServiceLimits& limits) {
  RETURN_IF_ERROR(ValidateStream(request.stream(), limits));
  RoundInput round;
  round.stream = request.stream();
  round.round = request.round();
  absl::StatusOr<PlanInput> input = ToPlanInput(request, limits);
  if (input.ok()) {
    round.content_hash = input->content_hash;
    round.options_hash = input->options_hash;
    round.input = *std::move(input);
  } else {
    round.error = input.status();
    const absl::StatusOr<planner::PlanOptions> options =
        ToPlanOptions(request.options(), limits, /*planner_picks_k=*/true);
    const absl::StatusOr<planner::LossOptions> loss = ToLossOptions(request.loss());
    const v1::PlanOptions& p = request.options();
    PlanInput round_options;
    ReadRoundOptions(p, &round_options);
    round.options_hash =
        options.ok() && loss.ok()
            ? OptionsHash(*options, round_options, !request.loss_tokens().empty(), *loss)
            : Fingerprint64(
                  absl::StrCat(p.SerializeAsString(), request.loss().SerializeAsString()));
    // Identifies the (invalid) content for the same-round check. Bounded: gRPC has already
    // limited the message size.
    round.content_hash = absl::HashOf(request.SerializeAsString());
  }
  return round;
}

// The response's counts: the agreed k and this rank's own bound.
#define PACKSCHED_HEAD_Count(name) response->set_##name(k);
#define PACKSCHED_HEAD_LocalK(name) response->set_##name(plan.stats.local_k);
#define PACKSCHED_HEAD_Parts PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_HEAD_Indices PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_HEAD_Weights PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_HEAD_Global PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_HEAD_Stats PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_HEAD(name, number, Kind) PACKSCHED_HEAD_##Kind(name)

void PlanResponseHead(int64_t k, const planner::MicroBatchPlan& plan, v1::PlanResponse* response) {
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_HEAD)
}

// PACKSCHED_MICRO_BATCH, PACKSCHED_PLAN_RESPONSE and PACKSCHED_PLAN_STATS into the proto.
#define PACKSCHED_PART_Int(name) out->set_##name(part.name);
#define PACKSCHED_PART_Bool(name) out->set_##name(part.name);
#define PACKSCHED_PART_Ints(name) out->mutable_##name()->Assign(part.name.begin(), part.name.end());
#define PACKSCHED_PART_LossScale(name) \
  if (loss != nullptr && i < loss->loss_scales.size()) out->set_##name(loss->loss_scales[i]);
#define PACKSCHED_PART(name, number, Kind) PACKSCHED_PART_##Kind(name)
#define PACKSCHED_LISTS_Indices(name) \
  response->mutable_##name()->Assign(plan.name.begin(), plan.name.end());
#define PACKSCHED_LISTS_Weights(name)                                               \
  if (loss != nullptr) {                                                            \
    response->mutable_##name()->Assign(loss->weights.begin(), loss->weights.end()); \
  }
#define PACKSCHED_LISTS_Count PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_LISTS_LocalK PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_LISTS_Parts(name)                                         \
  response->mutable_##name()->Reserve(static_cast<int>(plan.parts.size())); \
  for (size_t i = 0; i < plan.parts.size(); ++i) {                          \
    const planner::MicroBatch& part = plan.parts[i];                        \
    v1::MicroBatch* out = response->add_##name();                           \
    PACKSCHED_MICRO_BATCH(PACKSCHED_PART)                                   \
  }
#define PACKSCHED_LISTS_Global PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_LISTS_Stats PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_LISTS(name, number, Kind) PACKSCHED_LISTS_##Kind(name)
#define PACKSCHED_STATS_Int(name, alias) stats->set_##name(plan.stats.name);
#define PACKSCHED_STATS_Double(name, alias) stats->set_##name(plan.stats.name);
#define PACKSCHED_STATS_Cap(name, alias) stats->set_##name(max_token_len);
#define PACKSCHED_STATS_LocalK PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_STATS_Micros PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_STATS(name, number, Kind, alias) PACKSCHED_STATS_##Kind(name, alias)

void PlanToProto(const planner::MicroBatchPlan& plan, const planner::LossWeights* loss,
                 int64_t max_token_len, v1::PlanResponse* response) {
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_LISTS)
  v1::PlanStats* stats = response->mutable_stats();
  PACKSCHED_PLAN_STATS(PACKSCHED_STATS)
}

#define PACKSCHED_RESULT_Count(name) response->set_##name(result.name);
#define PACKSCHED_RESULT_LocalK(name) response->set_##name(result.local_k);
#define PACKSCHED_RESULT_Parts PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_RESULT_Indices PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_RESULT_Weights PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_RESULT_Global PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_RESULT_Stats PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_RESULT(name, number, Kind) PACKSCHED_RESULT_##Kind(name)
#define PACKSCHED_GLOBAL(name, number, Kind) global->set_##name(result.global.name);
#define PACKSCHED_TIMES_Micros(name, alias) \
  stats->set_##name(absl::ToInt64Microseconds(result.alias##_time));
#define PACKSCHED_TIMES_Int PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_TIMES_Double PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_TIMES_Cap PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_TIMES_LocalK PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_TIMES(name, number, Kind, alias) PACKSCHED_TIMES_##Kind(name, alias)

void RoundResultToProto(const RoundResult& result, v1::PlanResponse* response) {
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_RESULT)
  PlanToProto(result.plan, result.loss ? &*result.loss : nullptr, result.max_token_len, response);
  v1::GlobalCounts* global = response->mutable_global();
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_GLOBAL)
  v1::PlanStats* stats = response->mutable_stats();
  PACKSCHED_PLAN_STATS(PACKSCHED_TIMES)
}

}  // namespace packsched::service
