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
#include "server/planner/tree_plan.h"
#include "server/service/field_errors.h"
#include "server/service/forest_convert.h"
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

// A PlanInput holding the round's options of `p` (PACKSCHED_ROUND_OPTIONS), defaults applied,
// and nothing else yet. The row
//   X(same_micro_num_in_dp, 16, true)
// expands, through PACKSCHED_READ_ROUND, to
//   out.same_micro_num_in_dp = p.has_same_micro_num_in_dp() ? p.same_micro_num_in_dp() : (true);
#define PACKSCHED_READ_ROUND_Option(p, out, name, dflt) \
  (out).name = (p).has_##name() ? (p).name() : (dflt);
#define PACKSCHED_READ_ROUND(name, number, dflt) PACKSCHED_READ_ROUND_Option(p, out, name, dflt)

PlanInput WithRoundOptions(const v1::PlanOptions& p) {
  PlanInput out;
  PACKSCHED_ROUND_OPTIONS(PACKSCHED_READ_ROUND)
  return out;
}

// The Ceiling option, read into `*out`: 0 = the server's limit (the flag `flag`), which it may not
// exceed. Returns its value, or the error that names `field`.
absl::StatusOr<int64_t> ReadCeiling(absl::string_view field, int64_t value,
                                    const ServiceLimits& limits, absl::string_view flag,
                                    int64_t* out) {
  ASSIGN_OR_RETURN(*out, OrDefault(field, value, limits.max_micro_batches));
  if (*out > limits.max_micro_batches) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, " = ", *out, " exceeds the server limit --", flag, " = ", limits.max_micro_batches));
  }
  return *out;
}

}  // namespace

absl::StatusOr<PlanInput> MakePlanInput(const google::protobuf::RepeatedField<int64_t>& lengths,
                                        const v1::PlanOptions& options,
                                        const google::protobuf::RepeatedField<int64_t>& loss_tokens,
                                        const v1::LossOptions& loss, const ServiceLimits& limits,
                                        bool planner_picks_k, const v1::Forest* forest) {
  PlanInput input = WithRoundOptions(options);
  // Options first: they are small, and bound everything sized by them.
  ASSIGN_OR_RETURN(input.options, ToPlanOptions(options, limits, planner_picks_k));
  ASSIGN_OR_RETURN(input.loss, ToLossOptions(loss));
  std::vector<int64_t> rollout_len;  // the forest's, for loss_tokens
  if (forest != nullptr) {
    if (!lengths.empty()) {
      return absl::InvalidArgumentError("lengths and forest are both set: give one of them");
    }
    ASSIGN_OR_RETURN(input.forest, ToForest(*forest, limits));
    ASSIGN_OR_RETURN(const planner::ForestIndex index, planner::IndexForest(*input.forest));
    rollout_len = index.rollout_len;
  } else {
    ASSIGN_OR_RETURN(input.lengths, ToLengths(lengths, limits));
  }
  ASSIGN_OR_RETURN(input.loss_tokens,
                   ToLossTokens(loss_tokens, forest != nullptr ? rollout_len : input.lengths));
  input.options_hash = OptionsHash(input.options, input, input.loss_tokens.has_value(), input.loss);
  const planner::Forest none;
  const planner::Forest& f = input.forest ? *input.forest : none;
  input.content_hash = absl::HashOf(
      input.options_hash, absl::MakeConstSpan(input.lengths),
      input.loss_tokens ? absl::MakeConstSpan(*input.loss_tokens) : absl::Span<const int64_t>(),
      input.loss_tokens.has_value(), input.forest.has_value(), absl::MakeConstSpan(f.node_len),
      absl::MakeConstSpan(f.node_parent), absl::MakeConstSpan(f.rollout_leaf));
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

// ToPlanOptions reads the rows of PACKSCHED_PLAN_OPTIONS (server/planner/schema.h), one macro
// per rule, each taking what it touches as arguments: `p` (the request's v1::PlanOptions), `o`
// (the planner::PlanOptions it fills), `checks` (the request's context: OptionChecks) and the
// row's columns. Errors name "options.<name>" and the value. The rows run in proto order, and
// two rules report an error computed beforehand, where it has always been reported: the Ceiling
// field's, at the first field it bounds (a Count field), and the Weight fields' signs, together
// at the first Weight field, before either's bound. The row
//   X(min_micro_batches, 4, Count, int64, min_micro_batches, 5, "the plan has at least ...")
// expands, through PACKSCHED_READ_OPTION, to
//   {
//     RETURN_IF_ERROR(checks.ceiling.status());
//     ASSIGN_OR_RETURN(o.min_micro_batches,
//                      OrDefault("options." "min_micro_batches", p.min_micro_batches(), 1));
//     RETURN_IF_ERROR(AtMost("options." "min_micro_batches", o.min_micro_batches,
//                            planner::schema::OptionNamed("Ceiling"), *checks.ceiling));
//   }
struct OptionChecks {
  bool planner_picks_k = false;         // Plan, BalanceBatch: see ToPlanOptions in convert.h
  absl::StatusOr<int64_t> ceiling = 0;  // the Ceiling field's value, or its error
  absl::Status weights;                 // the Weight fields' sign check
};

#define PACKSCHED_READ_Cap(p, o, checks, name, Type, member)                                      \
  {                                                                                               \
    (o).member = (p).name();                                                                      \
    if ((o).member < 0 || ((checks).planner_picks_k && (o).member < 1)) {                         \
      return absl::InvalidArgumentError(absl::StrCat(                                             \
          "options." #name " = ", (o).member,                                                     \
          (checks).planner_picks_k ? ": must be >= 1 (tokens)" : ": must be >= 0 (0 = no cap)")); \
    }                                                                                             \
    RETURN_IF_ERROR(                                                                              \
        AtMost("options." #name, (o).member, "the largest length", planner::kMaxLength));         \
  }
#define PACKSCHED_READ_Enum(p, o, checks, name, Type, member)                               \
  {                                                                                         \
    const int value = (p).name();                                                           \
    if (!v1::Type##_IsValid(value)) {                                                       \
      return NotKnown("options." #name, value, v1::Type##_descriptor());                    \
    }                                                                                       \
    (o).member =                                                                            \
        value == 0 ? planner::PlanOptions{}.member : static_cast<planner::Type>(value - 1); \
  }
#define PACKSCHED_READ_Unlimited(p, o, checks, name, Type, member)     \
  {                                                                    \
    if ((p).name() < 0) return Negative("options." #name, (p).name()); \
    (o).member = (p).name();                                           \
  }
#define PACKSCHED_READ_Count(p, o, checks, name, Type, member)                                    \
  {                                                                                               \
    RETURN_IF_ERROR((checks).ceiling.status());                                                   \
    ASSIGN_OR_RETURN((o).member, OrDefault("options." #name, (p).name(), 1));                     \
    RETURN_IF_ERROR(AtMost("options." #name, (o).member, planner::schema::OptionNamed("Ceiling"), \
                           *(checks).ceiling));                                                   \
  }
#define PACKSCHED_READ_Align(p, o, checks, name, Type, member)                              \
  {                                                                                         \
    ASSIGN_OR_RETURN((o).member, OrDefault("options." #name, (p).name(), 1));               \
    RETURN_IF_ERROR(AtMost("options." #name, (o).member, "the limit", planner::kMaxAlign)); \
  }
#define PACKSCHED_READ_Weight(p, o, checks, name, Type, member)                           \
  {                                                                                       \
    RETURN_IF_ERROR((checks).weights);                                                    \
    RETURN_IF_ERROR(                                                                      \
        AtMost("options." #name, (o).member, "the limit", planner::kMaxAttentionWeight)); \
  }
#define PACKSCHED_READ_Ceiling(p, o, checks, name, Type, member) \
  RETURN_IF_ERROR((checks).ceiling.status());
// equal_size gives n / k sequences per micro-batch for a k the caller fixes. Where the planner
// picks k it would ignore the cap, and a k agreed by the ranks need not divide this rank's n:
// the round would fail after agreement.
#define PACKSCHED_READ_FixedK(p, o, checks, name, Type, member)                \
  {                                                                            \
    if ((p).name() && (checks).planner_picks_k) {                              \
      return absl::InvalidArgumentError(                                       \
          "options." #name                                                     \
          " = true applies to Partition only (a micro-batch count the caller " \
          "fixes); Plan and BalanceBatch choose the count under the cap");     \
    }                                                                          \
    (o).member = (p).name();                                                   \
  }
#define PACKSCHED_READ_OPTION(name, number, Rule, Type, member, json, help) \
  PACKSCHED_READ_##Rule(p, o, checks, name, Type, member)

// The ceiling, before the fields it bounds (a huge min_micro_batches or divisible_by is rejected
// before the planner sizes anything by it): 0 = the server's limit, which it may not exceed (the
// server flag of the same name). The other rules have nothing to do here. The row
//   X(max_micro_batches, 14, Ceiling, int64, max_micro_batches, 13, "fail if ...")
// expands, through PACKSCHED_READ_CEILING, to
//   ceiling = ReadCeiling("options." "max_micro_batches", p.max_micro_batches(), limits,
//                         "max_micro_batches", &o.max_micro_batches);
#define PACKSCHED_CEILING_Ceiling(p, o, limits, ceiling, name, member) \
  (ceiling) = ReadCeiling("options." #name, (p).name(), limits, #name, &(o).member);
#define PACKSCHED_READ_CEILING(name, number, Rule, Type, member, json, help) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_CEILING, Rule, Ceiling)                    \
  (p, o, limits, checks.ceiling, name, member)

// The Weight fields (proto3 optional: unset = the planner's default), signs first, both
// together; their bounds are checked in the main pass. The other rules have nothing to do here.
// The row
//   X(attention_linear, 10, Weight, int64, attention.linear, 10, "")
// expands, through PACKSCHED_READ_WEIGHT, to
//   if (weights.ok()) {
//     o.attention.linear = p.has_attention_linear() ? p.attention_linear()
//                                                   : planner::PlanOptions{}.attention.linear;
//     if (o.attention.linear < 0) weights = Negative("options." "attention_linear", ...);
//   }
#define PACKSCHED_WEIGHT_Weight(p, o, weights, name, member)                    \
  if ((weights).ok()) {                                                         \
    (o).member = (p).has_##name() ? (p).name() : planner::PlanOptions{}.member; \
    if ((o).member < 0) (weights) = Negative("options." #name, (o).member);     \
  }
#define PACKSCHED_READ_WEIGHT(name, number, Rule, Type, member, json, help) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_WEIGHT, Rule, Weight)(p, o, checks.weights, name, member)

absl::StatusOr<planner::PlanOptions> ToPlanOptions(const v1::PlanOptions& p,
                                                   const ServiceLimits& limits,
                                                   bool planner_picks_k) {
  planner::PlanOptions o;
  OptionChecks checks;
  checks.planner_picks_k = planner_picks_k;
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_READ_CEILING)
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_READ_WEIGHT)
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_READ_OPTION)
  return o;
}

// ToLossOptions reads the rows of PACKSCHED_LOSS_OPTIONS the same way ("loss.<name>"). The row
//   X(sum_norm_constant, 3, SumNorm, double, sum_norm_constant, sum_norm_constant)
// expands, through PACKSCHED_READ_LOSS, to
//   if (o.mode == planner::LossMode::kSumNorm) {
//     const double c = p.sum_norm_constant();
//     if (!std::isfinite(c) || c <= 0) return absl::InvalidArgumentError(...);
//     o.sum_norm_constant = c;
//   }
#define PACKSCHED_READ_LOSS_Enum(p, o, name, Type, member)                                  \
  {                                                                                         \
    const int value = (p).name();                                                           \
    if (!v1::Type##_IsValid(value)) {                                                       \
      return NotKnown("loss." #name, value, v1::Type##_descriptor());                       \
    }                                                                                       \
    (o).member =                                                                            \
        value == 0 ? planner::LossOptions{}.member : static_cast<planner::Type>(value - 1); \
  }
#define PACKSCHED_READ_LOSS_SumNorm(p, o, name, Type, member)                           \
  if ((o).mode == planner::LossMode::kSumNorm) {                                        \
    const double c = (p).name();                                                        \
    if (!std::isfinite(c) || c <= 0) {                                                  \
      return absl::InvalidArgumentError(absl::StrCat(                                   \
          "loss." #name " = ", c, ": loss mode sum_norm needs a finite constant > 0")); \
    }                                                                                   \
    (o).member = c;                                                                     \
  }
#define PACKSCHED_READ_LOSS(name, number, Rule, Type, member, key) \
  PACKSCHED_READ_LOSS_##Rule(p, o, name, Type, member)

absl::StatusOr<planner::LossOptions> ToLossOptions(const v1::LossOptions& p) {
  planner::LossOptions o;
  PACKSCHED_LOSS_OPTIONS(PACKSCHED_READ_LOSS)
  return o;
}

absl::StatusOr<PlanInput> ToPlanInput(const v1::PlanRequest& request, const ServiceLimits& limits) {
  return MakePlanInput(request.lengths(), request.options(), request.loss_tokens(), request.loss(),
                       limits, /*planner_picks_k=*/true,
                       request.has_forest() ? &request.forest() : nullptr);
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
    const PlanInput round_options = WithRoundOptions(p);
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

// The response's counts (PACKSCHED_PLAN_RESPONSE's Count and LocalK rows; the other kinds are
// written by PlanToProto and have nothing to do here). The row
//   X(local_num_micro_batches, 2, LocalK)
// expands, through PACKSCHED_HEAD, to
//   response->set_local_num_micro_batches(plan.stats.local_k);
#define PACKSCHED_HEAD_Count(response, k, plan, name) (response)->set_##name(k);
#define PACKSCHED_HEAD_LocalK(response, k, plan, name) (response)->set_##name((plan).stats.local_k);
#define PACKSCHED_HEAD(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_HEAD, Kind, Count, LocalK)(response, k, plan, name)

void PlanResponseHead(int64_t k, const planner::MicroBatchPlan& plan, v1::PlanResponse* response) {
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_HEAD)
}

// A plan into the response: its lists (PACKSCHED_PLAN_RESPONSE's Parts, Indices and Weights
// rows; the counts, the global counts, the stats and a tree plan's layout, TreePlanToProto, are
// written elsewhere), each micro-batch
// (PACKSCHED_MICRO_BATCH) and its stats (PACKSCHED_PLAN_STATS; the planner's local_k is the
// response's own field, and the durations are a round's). The rows
//   X(reorder, 4, Indices)         X(tokens, 2, Int)        X(imbalance, 7, Double, _)
// expand, through PACKSCHED_LISTS, PACKSCHED_PART and PACKSCHED_STATS, to
//   response->mutable_reorder()->Assign(plan.reorder.begin(), plan.reorder.end());
//   out->set_tokens(part.tokens);   (in the loop over the plan's micro-batches)
//   stats->set_imbalance(plan.stats.imbalance);
#define PACKSCHED_PART_Int(out, part, loss, i, name) (out)->set_##name((part).name);
#define PACKSCHED_PART_Bool(out, part, loss, i, name) (out)->set_##name((part).name);
#define PACKSCHED_PART_Ints(out, part, loss, i, name) \
  (out)->mutable_##name()->Assign((part).name.begin(), (part).name.end());
#define PACKSCHED_PART_LossScale(out, part, loss, i, name)   \
  if ((loss) != nullptr && (i) < (loss)->loss_scales.size()) \
    (out)->set_##name((loss)->loss_scales[(i)]);
#define PACKSCHED_PART(name, number, Kind) PACKSCHED_PART_##Kind(out, part, loss, i, name)
#define PACKSCHED_LISTS_Indices(response, plan, loss, name) \
  (response)->mutable_##name()->Assign((plan).name.begin(), (plan).name.end());
#define PACKSCHED_LISTS_Weights(response, plan, loss, name)                               \
  if ((loss) != nullptr) {                                                                \
    (response)->mutable_##name()->Assign((loss)->weights.begin(), (loss)->weights.end()); \
  }
#define PACKSCHED_LISTS_Parts(response, plan, loss, name)                       \
  (response)->mutable_##name()->Reserve(static_cast<int>((plan).parts.size())); \
  for (size_t i = 0; i < (plan).parts.size(); ++i) {                            \
    const planner::MicroBatch& part = (plan).parts[i];                          \
    v1::MicroBatch* out = (response)->add_##name();                             \
    PACKSCHED_MICRO_BATCH(PACKSCHED_PART)                                       \
  }
#define PACKSCHED_LISTS(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_LISTS, Kind, Indices, Weights, Parts)(response, plan, loss, name)
#define PACKSCHED_STATS_Int(stats, plan, max_token_len, name) \
  (stats)->set_##name((plan).stats.name);
#define PACKSCHED_STATS_Double(stats, plan, max_token_len, name) \
  (stats)->set_##name((plan).stats.name);
#define PACKSCHED_STATS_Cap(stats, plan, max_token_len, name) (stats)->set_##name(max_token_len);
#define PACKSCHED_STATS(name, number, Kind, alias) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_STATS, Kind, LocalK, Micros)(stats, plan, max_token_len, name)

void PlanToProto(const planner::MicroBatchPlan& plan, const planner::LossWeights* loss,
                 int64_t max_token_len, v1::PlanResponse* response) {
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_LISTS)
  v1::PlanStats* stats = response->mutable_stats();
  PACKSCHED_PLAN_STATS(PACKSCHED_STATS)
  if (loss != nullptr) stats->set_loss_tokens(loss->loss_tokens);  // the planner cannot know
}

// A round's own figures, beside its plan: the counts (PACKSCHED_PLAN_RESPONSE's Count and LocalK
// rows), the global counts (every row of PACKSCHED_GLOBAL_COUNTS) and the durations
// (PACKSCHED_PLAN_STATS' Micros rows). The rows
//   X(num_micro_batches, 1, Count)   X(loss_tokens, 2, Loss)   X(wait_us, 14, Micros, wait)
// expand, through PACKSCHED_RESULT, PACKSCHED_GLOBAL and PACKSCHED_TIMES, to
//   response->set_num_micro_batches(result.num_micro_batches);
//   global->set_loss_tokens(result.global.loss_tokens);
//   stats->set_wait_us(absl::ToInt64Microseconds(result.wait_time));
#define PACKSCHED_RESULT_Count(response, result, name) (response)->set_##name((result).name);
#define PACKSCHED_RESULT_LocalK(response, result, name) (response)->set_##name((result).local_k);
#define PACKSCHED_RESULT_Tree(response, result, name) \
  if ((result).name) TreePlanToProto(*(result).name, (response)->mutable_##name());
#define PACKSCHED_RESULT(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_RESULT, Kind, Count, LocalK, Tree)(response, result, name)
#define PACKSCHED_GLOBAL_Count(global, result, name) (global)->set_##name((result).global.name);
#define PACKSCHED_GLOBAL(name, number, Kind) PACKSCHED_GLOBAL_Count(global, result, name)
#define PACKSCHED_TIMES_Micros(stats, result, name, alias) \
  (stats)->set_##name(absl::ToInt64Microseconds((result).alias##_time));
#define PACKSCHED_TIMES(name, number, Kind, alias) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_TIMES, Kind, Micros)(stats, result, name, alias)

void RoundResultToProto(const RoundResult& result, v1::PlanResponse* response) {
  PACKSCHED_PLAN_RESPONSE(PACKSCHED_RESULT)
  PlanToProto(result.plan, result.loss ? &*result.loss : nullptr, result.max_token_len, response);
  v1::GlobalCounts* global = response->mutable_global();
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_GLOBAL)
  v1::PlanStats* stats = response->mutable_stats();
  PACKSCHED_PLAN_STATS(PACKSCHED_TIMES)
}

}  // namespace packsched::service
