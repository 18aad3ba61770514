#include "server/service/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "server/base/checked_math.h"
#include "server/base/fingerprint.h"
#include "server/base/status_macros.h"

namespace packsched::service {
namespace {

constexpr int64_t kDefaultAttentionLinear = planner::AttentionCost{}.linear;
constexpr int64_t kDefaultAttentionQuadratic = planner::AttentionCost{}.quadratic;

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

uint64_t OptionsHash(const planner::PlanOptions& o, bool same_micro_num_in_dp, bool has_loss,
                     const planner::LossOptions& loss) {
  const int64_t fields[] = {kProtocolVersion,
                            o.max_token_len,
                            static_cast<int64_t>(o.cap_mode),
                            o.max_seqs_per_micro_batch,
                            o.min_micro_batches,
                            o.divisible_by,
                            o.align_to,
                            o.align_total_to,
                            static_cast<int64_t>(o.algorithm),
                            static_cast<int64_t>(o.cost),
                            o.attention.linear,
                            o.attention.quadratic,
                            static_cast<int64_t>(o.overlong),
                            static_cast<int64_t>(o.order),
                            o.max_micro_batches,
                            o.equal_size,
                            same_micro_num_in_dp,
                            has_loss,
                            static_cast<int64_t>(loss.mode),
                            static_cast<int64_t>(loss.dp_reduction),
                            static_cast<int64_t>(DoubleBits(loss.sum_norm_constant))};
  uint64_t h = kFingerprintSeed;
  for (int64_t field : fields) h = Fingerprint64(field, h);
  return h;
}

absl::StatusOr<PlanInput> MakePlanInput(const google::protobuf::RepeatedField<int64_t>& lengths,
                                        const v1::PlanOptions& options,
                                        const google::protobuf::RepeatedField<int64_t>& loss_tokens,
                                        const v1::LossOptions& loss, const ServiceLimits& limits,
                                        bool planner_picks_k) {
  PlanInput input;
  // Options first: they are small, and bound everything sized by them.
  ASSIGN_OR_RETURN(input.options, ToPlanOptions(options, limits, planner_picks_k));
  ASSIGN_OR_RETURN(input.loss, ToLossOptions(loss));
  input.same_micro_num_in_dp =
      options.has_same_micro_num_in_dp() ? options.same_micro_num_in_dp() : true;
  ASSIGN_OR_RETURN(input.lengths, ToLengths(lengths, limits));
  ASSIGN_OR_RETURN(input.loss_tokens, ToLossTokens(loss_tokens, input.lengths));
  input.options_hash = OptionsHash(input.options, input.same_micro_num_in_dp,
                                   input.loss_tokens.has_value(), input.loss);
  input.content_hash = absl::HashOf(
      input.options_hash, absl::MakeConstSpan(input.lengths),
      input.loss_tokens ? absl::MakeConstSpan(*input.loss_tokens) : absl::Span<const int64_t>(),
      input.loss_tokens.has_value());
  return input;
}

absl::StatusOr<planner::LossWeights> WeightsFor(const planner::MicroBatchPlan& plan,
                                                const std::vector<int64_t>& loss_tokens,
                                                const planner::LossOptions& loss,
                                                const planner::LossCounts& global,
                                                int64_t world_size) {
  return planner::ComputeLossWeights(plan, loss_tokens, loss, global, world_size);
}

}  // namespace

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

absl::StatusOr<planner::PlanOptions> ToPlanOptions(const v1::PlanOptions& p,
                                                   const ServiceLimits& limits, bool planner_picks_k) {
  planner::PlanOptions o;
  o.max_token_len = p.max_token_len();
  if (o.max_token_len < 0 || (planner_picks_k && o.max_token_len < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.max_token_len = ", o.max_token_len,
                     planner_picks_k ? ": must be >= 1 (tokens)" : ": must be >= 0 (0 = no cap)"));
  }
  RETURN_IF_ERROR(
      AtMost("options.max_token_len", o.max_token_len, "the largest length", planner::kMaxLength));
  switch (p.cap_mode()) {
    case v1::CAP_MODE_UNSPECIFIED:
    case v1::CAP_MODE_TOKENS:
      o.cap_mode = planner::CapMode::kTokens;
      break;
    case v1::CAP_MODE_PADDED:
      o.cap_mode = planner::CapMode::kPadded;
      break;
    default:
      return NotKnown("options.cap_mode", p.cap_mode(), v1::CapMode_descriptor());
  }
  if (p.max_seqs_per_micro_batch() < 0) {
    return Negative("options.max_seqs_per_micro_batch", p.max_seqs_per_micro_batch());
  }
  o.max_seqs_per_micro_batch = p.max_seqs_per_micro_batch();
  // The ceiling comes first: min_micro_batches and divisible_by are bounded by it, so a huge
  // value is rejected here, before the planner sizes anything by it.
  ASSIGN_OR_RETURN(o.max_micro_batches, OrDefault("options.max_micro_batches",
                                                  p.max_micro_batches(), limits.max_micro_batches));
  if (o.max_micro_batches > limits.max_micro_batches) {
    return absl::ResourceExhaustedError(
        absl::StrCat("options.max_micro_batches = ", o.max_micro_batches,
                     " exceeds the server limit --max_micro_batches = ", limits.max_micro_batches));
  }
  ASSIGN_OR_RETURN(o.min_micro_batches,
                   OrDefault("options.min_micro_batches", p.min_micro_batches(), 1));
  RETURN_IF_ERROR(AtMost("options.min_micro_batches", o.min_micro_batches, "max_micro_batches",
                         o.max_micro_batches));
  ASSIGN_OR_RETURN(o.divisible_by, OrDefault("options.divisible_by", p.divisible_by(), 1));
  RETURN_IF_ERROR(
      AtMost("options.divisible_by", o.divisible_by, "max_micro_batches", o.max_micro_batches));
  ASSIGN_OR_RETURN(o.align_to, OrDefault("options.align_to", p.align_to(), 1));
  RETURN_IF_ERROR(AtMost("options.align_to", o.align_to, "the limit", planner::kMaxAlign));
  ASSIGN_OR_RETURN(o.align_total_to, OrDefault("options.align_total_to", p.align_total_to(), 1));
  RETURN_IF_ERROR(
      AtMost("options.align_total_to", o.align_total_to, "the limit", planner::kMaxAlign));
  switch (p.algorithm()) {
    case v1::ALGORITHM_UNSPECIFIED:
    case v1::ALGORITHM_KK:
      o.algorithm = planner::Algorithm::kKarmarkarKarp;
      break;
    case v1::ALGORITHM_LPT:
      o.algorithm = planner::Algorithm::kLpt;
      break;
    default:
      return NotKnown("options.algorithm", p.algorithm(), v1::Algorithm_descriptor());
  }
  switch (p.cost()) {
    case v1::COST_MODEL_UNSPECIFIED:
    case v1::COST_MODEL_TOKENS:
      o.cost = planner::CostModel::kTokens;
      break;
    case v1::COST_MODEL_ATTENTION:
      o.cost = planner::CostModel::kAttention;
      break;
    default:
      return NotKnown("options.cost", p.cost(), v1::CostModel_descriptor());
  }
  o.attention.linear = p.has_attention_linear() ? p.attention_linear() : kDefaultAttentionLinear;
  o.attention.quadratic =
      p.has_attention_quadratic() ? p.attention_quadratic() : kDefaultAttentionQuadratic;
  if (o.attention.linear < 0) return Negative("options.attention_linear", o.attention.linear);
  if (o.attention.quadratic < 0) {
    return Negative("options.attention_quadratic", o.attention.quadratic);
  }
  RETURN_IF_ERROR(AtMost("options.attention_linear", o.attention.linear, "the limit",
                         planner::kMaxAttentionWeight));
  RETURN_IF_ERROR(AtMost("options.attention_quadratic", o.attention.quadratic, "the limit",
                         planner::kMaxAttentionWeight));
  switch (p.overlong()) {
    case v1::OVERLONG_POLICY_UNSPECIFIED:
    case v1::OVERLONG_POLICY_REJECT:
      o.overlong = planner::OverlongPolicy::kReject;
      break;
    case v1::OVERLONG_POLICY_ISOLATE:
      o.overlong = planner::OverlongPolicy::kIsolate;
      break;
    case v1::OVERLONG_POLICY_DROP:
      o.overlong = planner::OverlongPolicy::kDrop;
      break;
    default:
      return NotKnown("options.overlong", p.overlong(), v1::OverlongPolicy_descriptor());
  }
  switch (p.order()) {
    case v1::PART_ORDER_UNSPECIFIED:
    case v1::PART_ORDER_COST_DESC:
      o.order = planner::PartOrder::kCostDesc;
      break;
    case v1::PART_ORDER_INDEX:
      o.order = planner::PartOrder::kIndex;
      break;
    case v1::PART_ORDER_INTERLEAVE:
      o.order = planner::PartOrder::kInterleave;
      break;
    default:
      return NotKnown("options.order", p.order(), v1::PartOrder_descriptor());
  }
  // equal_size gives n / k sequences per micro-batch for a k the caller fixes. Where the planner
  // picks k it would ignore the cap, and a k agreed by the ranks need not divide this rank's n:
  // the round would fail after agreement.
  if (p.equal_size() && planner_picks_k) {
    return absl::InvalidArgumentError(
        "options.equal_size = true applies to Partition only (a micro-batch count the caller "
        "fixes); Plan and BalanceBatch choose the count under the cap");
  }
  o.equal_size = p.equal_size();
  return o;
}

absl::StatusOr<planner::LossOptions> ToLossOptions(const v1::LossOptions& p) {
  planner::LossOptions o;
  switch (p.mode()) {
    case v1::LOSS_MODE_UNSPECIFIED:
    case v1::LOSS_MODE_TOKEN_MEAN:
      o.mode = planner::LossMode::kTokenMean;
      break;
    case v1::LOSS_MODE_SAMPLE_MEAN:
      o.mode = planner::LossMode::kSampleMean;
      break;
    case v1::LOSS_MODE_SEQ_SUM:
      o.mode = planner::LossMode::kSeqSum;
      break;
    case v1::LOSS_MODE_SUM:
      o.mode = planner::LossMode::kSum;
      break;
    case v1::LOSS_MODE_SUM_NORM:
      o.mode = planner::LossMode::kSumNorm;
      break;
    default:
      return NotKnown("loss.mode", p.mode(), v1::LossMode_descriptor());
  }
  switch (p.dp_reduction()) {
    case v1::DP_REDUCTION_UNSPECIFIED:
    case v1::DP_REDUCTION_SUM:
      o.dp_reduction = planner::DpReduction::kSum;
      break;
    case v1::DP_REDUCTION_MEAN:
      o.dp_reduction = planner::DpReduction::kMean;
      break;
    default:
      return NotKnown("loss.dp_reduction", p.dp_reduction(), v1::DpReduction_descriptor());
  }
  if (o.mode == planner::LossMode::kSumNorm) {
    const double c = p.sum_norm_constant();
    if (!std::isfinite(c) || c <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss.sum_norm_constant = ", c, ": loss mode sum_norm needs a finite constant > 0"));
    }
    o.sum_norm_constant = c;
  }
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
    round.options_hash =
        options.ok() && loss.ok()
            ? OptionsHash(*options, p.has_same_micro_num_in_dp() ? p.same_micro_num_in_dp() : true,
                          !request.loss_tokens().empty(), *loss)
            : Fingerprint64(
                  absl::StrCat(p.SerializeAsString(), request.loss().SerializeAsString()));
    // Identifies the (invalid) content for the same-round check. Bounded: gRPC has already
    // limited the message size.
    round.content_hash = absl::HashOf(request.SerializeAsString());
  }
  return round;
}

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
  const v1::GlobalCounts& g = request.global();
  if (g.loss_tokens() < 0) return Negative("global.loss_tokens", g.loss_tokens());
  if (g.sequences_with_loss() < 0) {
    return Negative("global.sequences_with_loss", g.sequences_with_loss());
  }
  if (g.world_size() < 0 || g.world_size() > planner::kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("global.world_size = ", g.world_size(),
                                                   ": must be in [0, ", planner::kMaxWorldSize,
                                                   "] (0 = 1)"));
  }
  ASSIGN_OR_RETURN(planner::MicroBatchPlan plan,
                   planner::PartitionFixedK(input.lengths, k, input.options));
  std::optional<planner::LossWeights> weights;
  const int64_t world_size = g.world_size() == 0 ? 1 : g.world_size();
  // Global counts sum every rank's, this one's included: one below this request's own is a
  // caller's mistake (e.g. `global` set for world_size alone) that would silently scale or zero
  // every weight.
  auto at_least_own = [](absl::string_view field, int64_t global, int64_t own) -> absl::Status {
    if (global >= own) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        field, " = ", global, " is below this request's own ", own,
        ": global counts are summed over every rank, this one included"));
  };
  if (request.has_global() && g.num_sequences() > 0) {
    RETURN_IF_ERROR(at_least_own("global.num_sequences", g.num_sequences(), plan.stats.num_kept));
  }
  if (input.loss_tokens) {
    ASSIGN_OR_RETURN(planner::LossCounts counts, planner::CountLoss(plan, *input.loss_tokens));
    if (request.has_global()) {
      RETURN_IF_ERROR(at_least_own("global.loss_tokens", g.loss_tokens(), counts.loss_tokens));
      RETURN_IF_ERROR(at_least_own("global.sequences_with_loss", g.sequences_with_loss(),
                                   counts.sequences_with_loss));
      counts.loss_tokens = g.loss_tokens();
      counts.sequences_with_loss = g.sequences_with_loss();
    }
    ASSIGN_OR_RETURN(weights, WeightsFor(plan, *input.loss_tokens, input.loss, counts, world_size));
    response->mutable_global()->set_loss_tokens(counts.loss_tokens);
    response->mutable_global()->set_sequences_with_loss(counts.sequences_with_loss);
  }
  response->set_num_micro_batches(k);
  response->set_local_num_micro_batches(plan.stats.local_k);
  response->mutable_global()->set_num_sequences(
      request.has_global() && g.num_sequences() > 0 ? g.num_sequences() : plan.stats.num_kept);
  response->mutable_global()->set_world_size(world_size);
  PlanToProto(plan, weights ? &*weights : nullptr, input.options.max_token_len, response);
  return absl::OkStatus();
}

absl::Status RunBalanceBatch(const v1::BalanceBatchRequest& request, const ServiceLimits& limits,
                             v1::BalanceBatchResponse* response) {
  ASSIGN_OR_RETURN(PlanInput input,
                   MakePlanInput(request.lengths(), request.options(), request.loss_tokens(),
                                 request.loss(), limits, /*planner_picks_k=*/true));
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
    return absl::ResourceExhaustedError(absl::StrCat(
        "world_size = ", world_size, " x max(min_micro_batches, divisible_by) = ",
        std::max(input.options.min_micro_batches, input.options.divisible_by),
        " micro-batches exceed the server limit --max_micro_batches = ", limits.max_micro_batches));
  }
  const std::vector<int64_t> group_ids(request.group_ids().begin(), request.group_ids().end());
  ASSIGN_OR_RETURN(planner::BalancedBatch batch,
                   planner::BalanceBatch(input.lengths, world_size, input.options, group_ids));
  response->set_num_micro_batches(batch.num_micro_batches);
  response->mutable_dropped()->Assign(batch.dropped.begin(), batch.dropped.end());
  v1::GlobalCounts* global = response->mutable_global();
  global->set_num_sequences(static_cast<int64_t>(input.lengths.size() - batch.dropped.size()));
  global->set_world_size(world_size);

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
      total.loss_tokens += counts.loss_tokens;
      total.sequences_with_loss += counts.sequences_with_loss;
    }
    global->set_loss_tokens(total.loss_tokens);
    global->set_sequences_with_loss(total.sequences_with_loss);
  }
  for (size_t r = 0; r < batch.ranks.size(); ++r) {
    const planner::RankBatch& rank = batch.ranks[r];
    v1::RankPlan* out = response->add_ranks();
    out->mutable_indices()->Assign(rank.indices.begin(), rank.indices.end());
    out->set_cost(rank.cost);
    v1::PlanResponse* plan = out->mutable_plan();
    plan->set_num_micro_batches(batch.num_micro_batches);
    plan->set_local_num_micro_batches(rank.plan.stats.local_k);
    *plan->mutable_global() = *global;
    std::optional<planner::LossWeights> weights;
    if (input.loss_tokens) {
      ASSIGN_OR_RETURN(weights, WeightsFor(rank.plan, rank_loss[r], input.loss, total, world_size));
    }
    PlanToProto(rank.plan, weights ? &*weights : nullptr, input.options.max_token_len, plan);
  }
  return absl::OkStatus();
}

void PlanToProto(const planner::MicroBatchPlan& plan, const planner::LossWeights* loss,
                 int64_t max_token_len, v1::PlanResponse* response) {
  response->mutable_micro_batches()->Reserve(static_cast<int>(plan.parts.size()));
  for (size_t i = 0; i < plan.parts.size(); ++i) {
    const planner::MicroBatch& part = plan.parts[i];
    v1::MicroBatch* out = response->add_micro_batches();
    out->mutable_indices()->Assign(part.indices.begin(), part.indices.end());
    out->set_tokens(part.tokens);
    out->set_aligned_tokens(part.aligned_tokens);
    out->set_total(part.total);
    out->set_padded_tokens(part.padded_tokens);
    out->set_cost(part.cost);
    out->set_max_seqlen(part.max_seqlen);
    out->set_max_seqlen_aligned(part.max_seqlen_aligned);
    out->mutable_cu_seqlens()->Assign(part.cu_seqlens.begin(), part.cu_seqlens.end());
    out->mutable_cu_seqlens_aligned()->Assign(part.cu_seqlens_aligned.begin(),
                                              part.cu_seqlens_aligned.end());
    out->set_empty(part.empty);
    out->set_overlong(part.overlong);
    if (loss != nullptr && i < loss->loss_scales.size()) out->set_loss_scale(loss->loss_scales[i]);
  }
  response->mutable_reorder()->Assign(plan.reorder.begin(), plan.reorder.end());
  response->mutable_revert()->Assign(plan.revert.begin(), plan.revert.end());
  response->mutable_dropped()->Assign(plan.dropped.begin(), plan.dropped.end());
  if (loss != nullptr) {
    response->mutable_loss_weights()->Assign(loss->weights.begin(), loss->weights.end());
  }
  v1::PlanStats* stats = response->mutable_stats();
  stats->set_num_sequences(plan.stats.num_sequences);
  stats->set_num_kept(plan.stats.num_kept);
  stats->set_total_tokens(plan.stats.total_tokens);
  stats->set_total_cost(plan.stats.total_cost);
  stats->set_max_part_cost(plan.stats.max_part_cost);
  stats->set_min_part_cost(plan.stats.min_part_cost);
  stats->set_imbalance(plan.stats.imbalance);
  stats->set_lower_bound_k(plan.stats.lower_bound_k);
  stats->set_max_token_len(max_token_len);
  stats->set_over_cap_parts(plan.stats.over_cap_parts);
  stats->set_naive_padded_tokens(plan.stats.naive_padded_tokens);
  stats->set_packed_tokens(plan.stats.packed_tokens);
}

void RoundResultToProto(const RoundResult& result, v1::PlanResponse* response) {
  response->set_num_micro_batches(result.num_micro_batches);
  response->set_local_num_micro_batches(result.local_k);
  PlanToProto(result.plan, result.loss ? &*result.loss : nullptr, result.max_token_len, response);
  v1::GlobalCounts* global = response->mutable_global();
  global->set_num_sequences(result.global.num_sequences);
  global->set_loss_tokens(result.global.loss_tokens);
  global->set_sequences_with_loss(result.global.sequences_with_loss);
  global->set_world_size(result.global.world_size);
  v1::PlanStats* stats = response->mutable_stats();
  stats->set_local_us(absl::ToInt64Microseconds(result.local_time));
  stats->set_wait_us(absl::ToInt64Microseconds(result.wait_time));
  stats->set_partition_us(absl::ToInt64Microseconds(result.partition_time));
}

}  // namespace packsched::service
