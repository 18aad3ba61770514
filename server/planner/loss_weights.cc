#include "server/planner/loss_weights.h"

#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/status_macros.h"

namespace packsched::planner {
namespace {

absl::Status CheckLossTokens(size_t num_sequences, absl::Span<const int64_t> loss_tokens) {
  if (loss_tokens.size() != num_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("loss_tokens has ", loss_tokens.size(),
                                                   " entries for ", num_sequences, " sequences"));
  }
  for (size_t i = 0; i < loss_tokens.size(); ++i) {
    if (loss_tokens[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss_tokens[", i, "] = ", loss_tokens[i], ": must be >= 0"));
    }
  }
  return absl::OkStatus();
}

constexpr std::array<std::pair<LossMode, absl::string_view>, 5> kLossModes = {{
    {LossMode::kTokenMean, "token_mean"},
    {LossMode::kSampleMean, "sample_mean"},
    {LossMode::kSeqSum, "seq_sum"},
    {LossMode::kSum, "sum"},
    {LossMode::kSumNorm, "sum_norm"},
}};
constexpr std::array<std::pair<DpReduction, absl::string_view>, 2> kDpReductions = {{
    {DpReduction::kSum, "sum"},
    {DpReduction::kMean, "mean"},
}};

template <typename Table, typename Enum>
absl::string_view Lookup(const Table& table, Enum v) {
  for (const auto& [value, name] : table) {
    if (value == v) return name;
  }
  return "unknown";
}

template <typename Table>
auto Parse(const Table& table, absl::string_view what, absl::string_view name)
    -> absl::StatusOr<typename Table::value_type::first_type> {
  for (const auto& [value, known] : table) {
    if (known == name) return value;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " '", name, "' is not one of ",
      absl::StrJoin(table, ", ",
                    [](std::string* out, const auto& e) { absl::StrAppend(out, e.second); })));
}

}  // namespace

absl::StatusOr<LossCounts> CountLoss(const MicroBatchPlan& plan,
                                     absl::Span<const int64_t> loss_tokens) {
  RETURN_IF_ERROR(CheckLossTokens(plan.revert.size(), loss_tokens));
  LossCounts counts;
  for (int64_t index : plan.reorder) {
    counts.loss_tokens += loss_tokens[index];
    if (loss_tokens[index] > 0) ++counts.sequences_with_loss;
  }
  return counts;
}

absl::StatusOr<LossCounts> CountLoss(const Problem& problem,
                                     absl::Span<const int64_t> loss_tokens) {
  RETURN_IF_ERROR(CheckLossTokens(static_cast<size_t>(problem.num_sequences()), loss_tokens));
  LossCounts counts;
  const std::vector<int64_t>& dropped = problem.dropped();  // ascending
  auto next_dropped = dropped.begin();
  for (int64_t index = 0; index < static_cast<int64_t>(loss_tokens.size()); ++index) {
    if (next_dropped != dropped.end() && *next_dropped == index) {
      ++next_dropped;
      continue;
    }
    counts.loss_tokens += loss_tokens[index];
    if (loss_tokens[index] > 0) ++counts.sequences_with_loss;
  }
  return counts;
}

absl::StatusOr<LossWeights> ComputeLossWeights(const MicroBatchPlan& plan,
                                               absl::Span<const int64_t> loss_tokens,
                                               const LossOptions& options, const LossCounts& global,
                                               int64_t world_size) {
  RETURN_IF_ERROR(CheckLossTokens(plan.revert.size(), loss_tokens));
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size = ", world_size, ": must be >= 1"));
  }
  if (options.mode == LossMode::kSumNorm &&
      !(std::isfinite(options.sum_norm_constant) && options.sum_norm_constant > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sum_norm_constant = ", options.sum_norm_constant, ": must be finite and > 0"));
  }
  const double scale = options.dp_reduction == DpReduction::kMean ? world_size : 1.0;
  const double per_token =
      global.loss_tokens > 0 ? 1.0 / static_cast<double>(global.loss_tokens) : 0.0;
  const double per_sequence =
      global.sequences_with_loss > 0 ? 1.0 / static_cast<double>(global.sequences_with_loss) : 0.0;
  auto weight = [&](int64_t tokens) -> double {
    switch (options.mode) {
      case LossMode::kTokenMean:
        return per_token;
      case LossMode::kSampleMean:
        return tokens > 0 ? per_sequence / static_cast<double>(tokens) : 0.0;
      case LossMode::kSeqSum:
        return tokens > 0 ? per_sequence : 0.0;
      case LossMode::kSum:
        return 1.0;
      case LossMode::kSumNorm:
        return 1.0 / options.sum_norm_constant;
    }
    return 0.0;
  };

  LossWeights out;
  out.weights.assign(plan.revert.size(), 0.0);
  for (int64_t index : plan.reorder) {
    out.weights[index] = weight(loss_tokens[index]) * scale;
    out.loss_tokens += loss_tokens[index];
  }
  out.loss_scales.reserve(plan.parts.size());
  for (const MicroBatch& part : plan.parts) {
    double common = part.empty ? 0.0 : out.weights[part.indices.front()];
    for (int64_t index : part.indices) {
      if (out.weights[index] != common) {
        common = std::numeric_limits<double>::quiet_NaN();
        break;
      }
    }
    out.loss_scales.push_back(common);
  }
  return out;
}

absl::string_view Name(LossMode v) { return Lookup(kLossModes, v); }
absl::string_view Name(DpReduction v) { return Lookup(kDpReductions, v); }
absl::StatusOr<LossMode> ParseLossMode(absl::string_view name) {
  return Parse(kLossModes, "loss_mode", name);
}
absl::StatusOr<DpReduction> ParseDpReduction(absl::string_view name) {
  return Parse(kDpReductions, "dp_reduction", name);
}

}  // namespace packsched::planner
