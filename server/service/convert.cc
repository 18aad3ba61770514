#include "server/service/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "server/base/checked_math.h"
#include "server/base/fingerprint.h"
#include "server/base/status_macros.h"
#include "server/planner/model_cost.h"
#include "server/planner/schema.h"
#include "server/planner/tree_plan.h"
#include "server/service/forest_convert.h"

namespace packsched::service {
namespace {

absl::Status NotKnown(absl::string_view field, int value,
                      const google::protobuf::EnumDescriptor* descriptor) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, " is not a known ", descriptor->name(), " value"));
}

absl::Status Negative(absl::string_view field, int64_t value) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, ": must be >= 0"));
}

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

uint64_t DoubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

int64_t HashValue(int64_t v) { return v; }
int64_t HashValue(bool v) { return v; }
int64_t HashValue(double v) { return static_cast<int64_t>(DoubleBits(v)); }
template <typename Enum, typename = std::enable_if_t<std::is_enum_v<Enum>>>
int64_t HashValue(Enum v) {
  return static_cast<int64_t>(v);
}

// Every option in proto field order (the same fingerprint as before the schema table), then
// whether the plan has loss weights, then the loss options.
uint64_t OptionsHash(const planner::PlanOptions& o, const PlanInput& round, bool has_loss,
                     const planner::LossOptions& loss) {
#define PACKSCHED_HASH_PLAN(name, number, Rule, Type, member, json, help) HashValue(o.member),
#define PACKSCHED_HASH_ROUND(name, number, dflt) HashValue(round.name),
#define PACKSCHED_HASH_LOSS(name, number, Rule, Type, member, key) HashValue(loss.member),
  const int64_t fields[] = {kProtocolVersion,
                            PACKSCHED_PLAN_OPTIONS(PACKSCHED_HASH_PLAN)
                                PACKSCHED_ROUND_OPTIONS(PACKSCHED_HASH_ROUND) has_loss,
                            PACKSCHED_LOSS_OPTIONS(PACKSCHED_HASH_LOSS)};
#undef PACKSCHED_HASH_PLAN
#undef PACKSCHED_HASH_ROUND
#undef PACKSCHED_HASH_LOSS
  uint64_t h = kFingerprintSeed;
  for (int64_t field : fields) h = Fingerprint64(field, h);
  return h;
}

// The round's options of PlanOptions (PACKSCHED_ROUND_OPTIONS) into `out`, defaults applied.
void ReadRoundOptions(const v1::PlanOptions& p, PlanInput* out) {
#define PACKSCHED_READ_ROUND(name, number, dflt) out->name = p.has_##name() ? p.name() : (dflt);
  PACKSCHED_ROUND_OPTIONS(PACKSCHED_READ_ROUND)
#undef PACKSCHED_READ_ROUND
}

// `forest`: the request's forest when it has one (tree packing), else null.
absl::StatusOr<PlanInput> MakePlanInput(const google::protobuf::RepeatedField<int64_t>& lengths,
                                        const v1::PlanOptions& options,
                                        const google::protobuf::RepeatedField<int64_t>& loss_tokens,
                                        const v1::LossOptions& loss, const ServiceLimits& limits,
                                        bool planner_picks_k, const v1::Forest* forest) {
  PlanInput input;
  // Options first: they are small, and bound everything sized by them.
  ASSIGN_OR_RETURN(input.options, ToPlanOptions(options, limits, planner_picks_k));
  ASSIGN_OR_RETURN(input.loss, ToLossOptions(loss));
  ReadRoundOptions(options, &input);
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

absl::StatusOr<planner::LossWeights> WeightsFor(const planner::MicroBatchPlan& plan,
                                                const std::vector<int64_t>& loss_tokens,
                                                const planner::LossOptions& loss,
                                                const planner::LossCounts& global,
                                                int64_t world_size) {
  return planner::ComputeLossWeights(plan, loss_tokens, loss, global, world_size);
}

// Saturating arithmetic for the estimates (an estimate that overflows is simply too large).
int64_t SatAdd(int64_t a, int64_t b) {
  return CheckedAdd(a, b).value_or(std::numeric_limits<int64_t>::max());
}
int64_t SatMul(int64_t a, int64_t b) {
  return CheckedMul(a, b).value_or(std::numeric_limits<int64_t>::max());
}

// An upper bound on the planner's local bound over `lengths` with (validated) options `o`,
// before the rounding to divisible_by and min_micro_batches: see EstimatePlanMemory in convert.h.
int64_t ItemPartsBound(const google::protobuf::RepeatedField<int64_t>& lengths,
                       const planner::PlanOptions& o) {
  const int64_t n = lengths.size();
  const int64_t cap = o.max_token_len;
  if (o.cap_mode != planner::CapMode::kTokens || o.max_seqs_per_micro_batch != 0 || cap < 1 ||
      cap / 2 - o.align_total_to + 1 < 1) {
    return n;
  }
  // Best fit: two parts at most half full each would have been one, so every part but one holds
  // more than cap/2 - (align_total_to - 1) aligned tokens; overlong sequences get a part each.
  const int64_t align = planner::EffectiveAlignTo(o);
  int64_t aligned = 0;
  int64_t overlong = 0;
  for (const int64_t length : lengths) {
    const int64_t a = std::clamp<int64_t>(length, 1, planner::kMaxLength);
    const int64_t rounded = (a + align - 1) / align * align;
    if (rounded > cap) {
      ++overlong;
    } else {
      aligned += rounded;  // <= 2^26 x 2^31: no overflow
    }
  }
  return std::min(n, 1 + aligned / (cap / 2 - o.align_total_to + 1) + overlong);
}

// min(K, roundup(max(m, items, 1), d)) over validated options (K = o.max_micro_batches).
int64_t CountBound(const planner::PlanOptions& o, int64_t items) {
  const int64_t k = std::max<int64_t>({o.min_micro_batches, items, 1});
  return std::min(o.max_micro_batches, SatMul(CeilDiv(k, o.divisible_by), o.divisible_by));
}

// A forest's items for the estimate: its nodes and its rollouts (each costs about a sequence).
int64_t ForestItems(const v1::Forest& forest) {
  return SatAdd(std::max(forest.node_len_size(), forest.node_parent_size()),
                std::max(forest.rollout_leaf_size(), forest.rollout_len_size()));
}

RequestMemory MemoryOf(int64_t sequences, int64_t micro_batches, int64_t wire_bytes) {
  return {sequences, micro_batches, wire_bytes, PeakBytes(sequences, micro_batches, wire_bytes)};
}

}  // namespace

int64_t PeakBytes(int64_t sequences, int64_t micro_batches, int64_t wire_bytes) {
  return SatAdd(
      SatAdd(kPeakBase, SatMul(kPeakPerSequence, sequences)),
      SatAdd(SatMul(kPeakPerMicroBatch, micro_batches), SatMul(kPeakPerWireByte, wire_bytes)));
}

// Options that validation refuses make the request fail before it allocates anything sized by
// them: they count no micro-batches.
RequestMemory EstimatePlanMemory(const v1::PlanRequest& request, const ServiceLimits& limits) {
  const absl::StatusOr<planner::PlanOptions> o =
      ToPlanOptions(request.options(), limits, /*planner_picks_k=*/true);
  if (request.has_forest()) {  // at most one piece per rollout
    const int64_t rollouts = request.forest().rollout_leaf_size();
    return MemoryOf(ForestItems(request.forest()), o.ok() ? CountBound(*o, rollouts) : 0,
                    static_cast<int64_t>(request.ByteSizeLong()));
  }
  const int64_t k = o.ok() ? CountBound(*o, ItemPartsBound(request.lengths(), *o)) : 0;
  return MemoryOf(request.lengths().size(), k, static_cast<int64_t>(request.ByteSizeLong()));
}

RequestMemory EstimatePartitionMemory(const v1::PartitionRequest& request,
                                      const ServiceLimits& limits) {
  const absl::StatusOr<planner::PlanOptions> o =
      ToPlanOptions(request.options(), limits, /*planner_picks_k=*/false);
  const int64_t k = request.num_micro_batches();
  const int64_t n = request.has_forest() ? ForestItems(request.forest()) : request.lengths().size();
  return MemoryOf(n, o.ok() && k >= 1 && k <= o->max_micro_batches ? k : 0,
                  static_cast<int64_t>(request.ByteSizeLong()));
}

RequestMemory EstimateBalanceBatchMemory(const v1::BalanceBatchRequest& request,
                                         const ServiceLimits& limits) {
  const int64_t n = request.has_forest() ? ForestItems(request.forest()) : request.lengths().size();
  const int64_t world_size = request.world_size();
  const absl::StatusOr<planner::PlanOptions> o =
      ToPlanOptions(request.options(), limits, /*planner_picks_k=*/true);
  int64_t parts = 0;
  if (o.ok() && world_size >= 1 && world_size <= planner::kMaxWorldSize && request.has_forest()) {
    // Every rank may hold every piece (at most one a rollout).
    parts = SatMul(world_size, CountBound(*o, request.forest().rollout_leaf_size()));
  } else if (o.ok() && world_size >= 1 && world_size <= planner::kMaxWorldSize) {
    // The largest rank's share: ceil(n / W), or all of them with groups (a group stays whole).
    const int64_t share = request.group_ids().empty() ? CeilDiv(n, world_size) : n;
    parts =
        SatMul(world_size, CountBound(*o, std::min(share, ItemPartsBound(request.lengths(), *o))));
  }
  return MemoryOf(n, parts, static_cast<int64_t>(request.ByteSizeLong()));
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
#define PACKSCHED_HEAD_Tree PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_HEAD(name, number, Kind) PACKSCHED_HEAD_##Kind(name)

void PlanResponseHead(int64_t k, const planner::MicroBatchPlan& plan,
                      v1::PlanResponse* response){PACKSCHED_PLAN_RESPONSE(PACKSCHED_HEAD)}

absl::Status RunPartition(const v1::PartitionRequest& request, const ServiceLimits& limits,
                          v1::PlanResponse* response) {
  ASSIGN_OR_RETURN(PlanInput input,
                   MakePlanInput(request.lengths(), request.options(), request.loss_tokens(),
                                 request.loss(), limits, /*planner_picks_k=*/false,
                                 request.has_forest() ? &request.forest() : nullptr));
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
  // `plan` answers; `loss_plan` is what the loss weights read (the plan over rollouts, for a
  // forest, whose micro-batches hold pieces).
  planner::MicroBatchPlan plan;
  planner::MicroBatchPlan loss_plan;
  std::optional<planner::TreePlan> tree;
  if (input.forest) {
    ASSIGN_OR_RETURN(tree, planner::PartitionForestFixedK(*input.forest, k, input.options));
    ASSIGN_OR_RETURN(const planner::ForestIndex index, planner::IndexForest(*input.forest));
    plan = planner::ResponseView(*tree, index);
    loss_plan = planner::RolloutView(*tree, index);
  } else {
    ASSIGN_OR_RETURN(plan, planner::PartitionFixedK(input.lengths, k, input.options));
  }
  const planner::MicroBatchPlan& weighed = input.forest ? loss_plan : plan;
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
    ASSIGN_OR_RETURN(planner::LossCounts counts, planner::CountLoss(weighed, *input.loss_tokens));
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
    ASSIGN_OR_RETURN(weights, WeightsFor(weighed, *input.loss_tokens, input.loss, counts, ranks));
#define PACKSCHED_SET_Loss(name) out->set_##name(counts.name);
#define PACKSCHED_SET_Kept(name)
#define PACKSCHED_SET_World(name)
#define PACKSCHED_SET(name, number, Kind) PACKSCHED_SET_##Kind(name)
    PACKSCHED_GLOBAL_COUNTS(PACKSCHED_SET)
  }
  PlanResponseHead(k, plan, response);
  PlanToProto(plan, weights ? &*weights : nullptr, input.options.max_token_len, response);
  if (tree) TreePlanToProto(*tree, response->mutable_tree());
  return absl::OkStatus();
}

namespace {

void StepToProto(const planner::StepStats& s, v1::StepStats* step) {
  step->set_step_sync_cost(s.step_sync_cost);
  step->set_micro_batch_sync_cost(s.micro_batch_sync_cost);
  step->set_ideal(s.ideal);
  step->set_efficiency(s.efficiency);
  step->set_lower_bound(s.lower_bound);
  step->set_lower_bound_efficiency(s.lower_bound_efficiency);
}

// BalanceBatch over a forest: every rank's plan over pieces, with global rollout ids in its
// index lists and `indices` (the rank's rollouts, ascending), its loss weights per rollout.
absl::Status RunBalanceForest(const PlanInput& input, int64_t world_size,
                              const planner::BalanceOptions& balance,
                              const v1::BalanceBatchRequest& request,
                              v1::BalanceBatchResponse* response) {
  ASSIGN_OR_RETURN(planner::BalancedForest batch,
                   planner::BalanceForest(*input.forest, world_size, input.options, balance));
  ASSIGN_OR_RETURN(const planner::ForestIndex index, planner::IndexForest(*input.forest));
  response->set_num_micro_batches(batch.num_micro_batches);
  StepToProto(batch.step, response->mutable_step());
  response->mutable_dropped()->Assign(batch.dropped.begin(), batch.dropped.end());
  v1::GlobalCounts* global = response->mutable_global();
  const int64_t kept =
      static_cast<int64_t>(input.forest->rollout_leaf.size() - batch.dropped.size());
  std::vector<planner::MicroBatchPlan> views;
  planner::LossCounts total;
  for (const planner::TreePlan& rank : batch.ranks) {
    views.push_back(planner::RolloutView(rank, index));
    if (input.loss_tokens) {
      ASSIGN_OR_RETURN(const planner::LossCounts counts,
                       planner::CountLoss(views.back(), *input.loss_tokens));
#define PACKSCHED_FOREST_SUM_Loss(name) total.name += counts.name;
#define PACKSCHED_FOREST_SUM_Kept(name)
#define PACKSCHED_FOREST_SUM_World(name)
#define PACKSCHED_FOREST_SUM(name, number, Kind) PACKSCHED_FOREST_SUM_##Kind(name)
      PACKSCHED_GLOBAL_COUNTS(PACKSCHED_FOREST_SUM)
    }
  }
  // Kept rollouts and the world; the loss counts summed over the ranks, with loss_tokens.
#define PACKSCHED_FOREST_GLOBAL_Kept(name) global->set_##name(kept);
#define PACKSCHED_FOREST_GLOBAL_Loss(name) \
  if (input.loss_tokens) global->set_##name(total.name);
#define PACKSCHED_FOREST_GLOBAL_World(name) global->set_##name(world_size);
#define PACKSCHED_FOREST_GLOBAL(name, number, Kind) PACKSCHED_FOREST_GLOBAL_##Kind(name)
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_FOREST_GLOBAL)
  for (size_t r = 0; r < batch.ranks.size(); ++r) {
    const planner::TreePlan& rank = batch.ranks[r];
    v1::RankPlan* out = response->add_ranks();
    int64_t cost = 0;
    for (const planner::TreeMicroBatch& part : rank.parts) cost += part.batch.cost;
    for (int64_t rollout : views[r].reorder) out->add_indices(rollout);
    std::sort(out->mutable_indices()->begin(), out->mutable_indices()->end());
    out->set_cost(cost);
    v1::PlanResponse* plan = out->mutable_plan();
    const planner::MicroBatchPlan answer = planner::ResponseView(rank, index);
    PlanResponseHead(batch.num_micro_batches, answer, plan);
    *plan->mutable_global() = *global;
    std::optional<planner::LossWeights> weights;
    if (input.loss_tokens) {
      ASSIGN_OR_RETURN(weights,
                       WeightsFor(views[r], *input.loss_tokens, input.loss, total, world_size));
    }
    PlanToProto(answer, weights ? &*weights : nullptr, input.options.max_token_len, plan);
    TreePlanToProto(rank, plan->mutable_tree());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunBalanceBatch(const v1::BalanceBatchRequest& request, const ServiceLimits& limits,
                             v1::BalanceBatchResponse* response) {
  ASSIGN_OR_RETURN(PlanInput input,
                   MakePlanInput(request.lengths(), request.options(), request.loss_tokens(),
                                 request.loss(), limits, /*planner_picks_k=*/true,
                                 request.has_forest() ? &request.forest() : nullptr));
  const int64_t world_size = request.world_size();
  if (world_size < 1 || world_size > planner::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size = ", world_size, ": must be in [1, ",
                                                   planner::kMaxWorldSize, "]"));
  }
  if (world_size > limits.max_sequences_per_request) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "world_size = ", world_size, " exceeds the server limit --max_sequences_per_request = ",
        limits.max_sequences_per_request));
  }
  if (input.forest && (request.has_model_config() || !request.group_ids().empty())) {
    return absl::InvalidArgumentError(
        "forest: group_ids and model_config must be unset (a tree is one item; its rollouts "
        "stay together)");
  }
  if (!request.group_ids().empty() &&
      static_cast<size_t>(request.group_ids().size()) != input.lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat("group_ids has ", request.group_ids().size(),
                                                   " entries for ", input.lengths.size(),
                                                   " sequences: must be empty or one per "
                                                   "sequence"));
  }
  // Every rank gets at least max(min_micro_batches, divisible_by) micro-batches: bound the total
  // over all ranks before the planner allocates them.
  const std::optional<int64_t> parts =
      CheckedMul(world_size, std::max(input.options.min_micro_batches, input.options.divisible_by));
  if (!parts || *parts > limits.max_micro_batches) {
    std::string counts;  // the Count options, "a, b"
    for (const planner::schema::OptionField& field : planner::schema::kPlanOptions) {
      if (field.rule == "Count") absl::StrAppend(&counts, counts.empty() ? "" : ", ", field.name);
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("world_size = ", world_size, " x max(", counts,
                     ") = ", std::max(input.options.min_micro_batches, input.options.divisible_by),
                     " micro-batches exceed the server limit --",
                     planner::schema::OptionNamed("Ceiling"), " = ", limits.max_micro_batches));
  }
  const std::vector<int64_t> group_ids(request.group_ids().begin(), request.group_ids().end());
  planner::BalanceOptions balance;
  if (!v1::Sync_IsValid(request.sync())) {
    return NotKnown("sync", request.sync(), v1::Sync_descriptor());
  }
  if (request.sync() != v1::SYNC_UNSPECIFIED) {
    balance.sync = static_cast<planner::Sync>(request.sync() - 1);
  }
  balance.micro_batch_cost = request.micro_batch_cost();
  if (request.has_model_config()) {
    const v1::ModelConfig& model = request.model_config();
    const absl::flat_hash_map<std::string, int64_t> ints(model.ints().begin(), model.ints().end());
    const absl::flat_hash_map<std::string, std::string> strings(model.strings().begin(),
                                                                model.strings().end());
    absl::StatusOr<int64_t> micro_batch_cost =
        planner::UseModelCost(ints, strings, input.lengths, input.options);
    if (!micro_batch_cost.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model_config: ", micro_batch_cost.status().message()));
    }
    balance.micro_batch_cost = *micro_batch_cost;
  }
  if (input.forest) return RunBalanceForest(input, world_size, balance, request, response);
  ASSIGN_OR_RETURN(
      planner::BalancedBatch batch,
      planner::BalanceBatch(input.lengths, world_size, input.options, group_ids, balance));
  response->set_num_micro_batches(batch.num_micro_batches);
  StepToProto(batch.step, response->mutable_step());
  response->mutable_dropped()->Assign(batch.dropped.begin(), batch.dropped.end());
  v1::GlobalCounts* global = response->mutable_global();
#define PACKSCHED_BATCH_Kept(name) \
  global->set_##name(static_cast<int64_t>(input.lengths.size() - batch.dropped.size()));
#define PACKSCHED_BATCH_Loss(name)
#define PACKSCHED_BATCH_World(name) global->set_##name(world_size);
#define PACKSCHED_BATCH(name, number, Kind) PACKSCHED_BATCH_##Kind(name)
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_BATCH)

  // Global loss counts over every rank's kept sequences, then each rank's weights.
  std::vector<std::vector<int64_t>> rank_loss(batch.ranks.size());
  planner::LossCounts total;
  if (input.loss_tokens) {
    for (size_t r = 0; r < batch.ranks.size(); ++r) {
      for (int64_t index : batch.ranks[r].indices) {
        rank_loss[r].push_back((*input.loss_tokens)[index]);
      }
      ASSIGN_OR_RETURN(planner::LossCounts counts,
                       planner::CountLoss(batch.ranks[r].plan, rank_loss[r]));
#define PACKSCHED_SUM_Loss(name) total.name += counts.name;
#define PACKSCHED_SUM_Kept(name)
#define PACKSCHED_SUM_World(name)
#define PACKSCHED_SUM(name, number, Kind) PACKSCHED_SUM_##Kind(name)
      PACKSCHED_GLOBAL_COUNTS(PACKSCHED_SUM)
    }
#define PACKSCHED_TOTAL_Loss(name) global->set_##name(total.name);
#define PACKSCHED_TOTAL_Kept(name)
#define PACKSCHED_TOTAL_World(name)
#define PACKSCHED_TOTAL(name, number, Kind) PACKSCHED_TOTAL_##Kind(name)
    PACKSCHED_GLOBAL_COUNTS(PACKSCHED_TOTAL)
  }
  for (size_t r = 0; r < batch.ranks.size(); ++r) {
    const planner::RankBatch& rank = batch.ranks[r];
    v1::RankPlan* out = response->add_ranks();
    out->mutable_indices()->Assign(rank.indices.begin(), rank.indices.end());
    out->set_cost(rank.cost);
    v1::PlanResponse* plan = out->mutable_plan();
    PlanResponseHead(batch.num_micro_batches, rank.plan, plan);
    *plan->mutable_global() = *global;
    std::optional<planner::LossWeights> weights;
    if (input.loss_tokens) {
      ASSIGN_OR_RETURN(weights, WeightsFor(rank.plan, rank_loss[r], input.loss, total, world_size));
    }
    PlanToProto(rank.plan, weights ? &*weights : nullptr, input.options.max_token_len, plan);
  }
  return absl::OkStatus();
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
#define PACKSCHED_LISTS_Tree PACKSCHED_SCHEMA_NOTHING  // TreePlanToProto (forest_convert.h)
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
#define PACKSCHED_RESULT_Tree PACKSCHED_SCHEMA_NOTHING
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
  if (result.tree) TreePlanToProto(*result.tree, response->mutable_tree());
  v1::GlobalCounts* global = response->mutable_global();
  PACKSCHED_GLOBAL_COUNTS(PACKSCHED_GLOBAL)
  v1::PlanStats* stats = response->mutable_stats();
  PACKSCHED_PLAN_STATS(PACKSCHED_TIMES)
}

}  // namespace packsched::service
