#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/checked_math.h"
#include "server/base/status_macros.h"
#include "server/planner/planner.h"
#include "server/planner/prepared.h"

namespace packsched::planner::internal {
namespace {

constexpr int64_t kMaxGivenCost = int64_t{1} << 62;

absl::Status OutOfRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, ": must be in [", lo, ", ", hi, "]"));
}

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) return OutOfRange(field, value, lo, hi);
  return absl::OkStatus();
}

template <typename Enum>
absl::Status CheckEnum(absl::string_view field, Enum value, Enum last) {
  const int raw = static_cast<int>(value);
  if (raw < 0 || raw > static_cast<int>(last)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = ", raw, " is not a known value"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const PlanOptions& o, bool cap_required, bool balancing) {
  RETURN_IF_ERROR(CheckEnum("cap_mode", o.cap_mode, CapMode::kPadded));
  RETURN_IF_ERROR(CheckEnum("algorithm", o.algorithm, Algorithm::kSequential));
  RETURN_IF_ERROR(CheckEnum("cost", o.cost, CostModel::kAttention));
  RETURN_IF_ERROR(CheckEnum("overlong", o.overlong, OverlongPolicy::kDrop));
  RETURN_IF_ERROR(CheckEnum("order", o.order, PartOrder::kInterleave));
  const bool packer = o.algorithm != Algorithm::kKarmarkarKarp && o.algorithm != Algorithm::kLpt;
  if (balancing && packer) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm ", Name(o.algorithm),
                     " packs a dataset into as many bins as needed; micro-batch balancing into "
                     "k parts uses kk or lpt"));
  }
  if (!balancing && !packer) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm ", Name(o.algorithm),
                     " balances k parts; dataset packing uses ffd, bfd or sequential"));
  }
  RETURN_IF_ERROR(CheckRange("max_token_len", o.max_token_len, cap_required ? 1 : 0, kMaxLength));
  RETURN_IF_ERROR(CheckRange("max_micro_batches", o.max_micro_batches, 1, kMaxSequences));
  RETURN_IF_ERROR(
      CheckRange("max_seqs_per_micro_batch", o.max_seqs_per_micro_batch, 0, kMaxSequences));
  RETURN_IF_ERROR(CheckRange("min_micro_batches", o.min_micro_batches, 1, o.max_micro_batches));
  RETURN_IF_ERROR(CheckRange("divisible_by", o.divisible_by, 1, o.max_micro_batches));
  RETURN_IF_ERROR(CheckRange("align_to", o.align_to, 1, kMaxAlign));
  RETURN_IF_ERROR(CheckRange("align_total_to", o.align_total_to, 1, kMaxAlign));
  RETURN_IF_ERROR(CheckRange("context_parallel", o.context_parallel, 1, kMaxAlign));
  RETURN_IF_ERROR(CheckRange("tensor_parallel", o.tensor_parallel, 1, kMaxAlign));
  const int64_t need = ParallelAlign(o);
  if (need > kMaxAlign) {
    return absl::InvalidArgumentError(absl::StrCat(
        "2 * context_parallel * tensor_parallel = ", need, ": must be at most ", kMaxAlign));
  }
  if (o.align_to != 1 && o.align_to % need != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "align_to = ", o.align_to, " is not a multiple of ", need,
        o.context_parallel > 1 ? " (2 * context_parallel * tensor_parallel)" : " (tensor_parallel)",
        ": leave align_to unset for that default"));
  }
  if (o.cost == CostModel::kAttention) {
    RETURN_IF_ERROR(CheckRange("attention.linear", o.attention.linear, 0, kMaxAttentionWeight));
    RETURN_IF_ERROR(
        CheckRange("attention.quadratic", o.attention.quadratic, 0, kMaxAttentionWeight));
    RETURN_IF_ERROR(CheckRange("attention.windowed", o.attention.windowed, 0, kMaxAttentionWeight));
    RETURN_IF_ERROR(CheckRange("attention.chunked", o.attention.chunked, 0, kMaxAttentionWeight));
    if (o.attention.windowed > 0) {
      RETURN_IF_ERROR(CheckRange("attention.window", o.attention.window, 1, kMaxLength));
    }
    if (o.attention.chunked > 0) {
      RETURN_IF_ERROR(CheckRange("attention.chunk", o.attention.chunk, 1, kMaxLength));
    }
    if (o.attention.linear == 0 && o.attention.quadratic == 0 && o.attention.windowed == 0 &&
        o.attention.chunked == 0) {
      return absl::InvalidArgumentError("attention cost weights are both 0: every cost would be 0");
    }
  }
  // equal_size promises counts, not the cap, so no sequence is overlong there: a policy that
  // drops or isolates sequences would break the counts it promises, and silently ignoring it
  // would keep sequences the caller asked to drop.
  if (o.equal_size && o.overlong != OverlongPolicy::kReject) {
    return absl::InvalidArgumentError(absl::StrCat(
        "equal_size gives every micro-batch n / k sequences and does not apply the cap, "
        "so overlong = ",
        Name(o.overlong), " cannot hold; leave overlong at reject"));
  }
  if (o.max_token_len > 0 && o.cap_mode == CapMode::kTokens && o.max_token_len < o.align_total_to) {
    return absl::InvalidArgumentError(absl::StrCat("max_token_len = ", o.max_token_len,
                                                   " is below align_total_to = ", o.align_total_to,
                                                   ": no micro-batch could hold a token"));
  }
  return absl::OkStatus();
}

// Cost of one aligned sequence; nullopt on int64 overflow.
std::optional<int64_t> CostOf(const PlanOptions& o, int64_t aligned) {
  if (o.cost == CostModel::kTokens) return aligned;
  const std::optional<int64_t> quad = AttentionScores(o.attention, 0, aligned);
  const std::optional<int64_t> lin = CheckedMul(o.attention.linear, aligned);
  if (!quad || !lin) return std::nullopt;
  const std::optional<int64_t> cost = CheckedAdd(*quad, *lin);
  // Under CP every rank runs an equal share of each sequence's attention (head-tail layout;
  // aligned is a multiple of 2 * cp, so the division is exact for full attention and rounds
  // down with windowed or chunked layers).
  if (!cost) return std::nullopt;
  return *cost / o.context_parallel;
}

}  // namespace

absl::StatusOr<Validated> Validate(absl::Span<const int64_t> lengths, const PlanOptions& options,
                                   bool cap_required, bool balancing,
                                   absl::Span<const int64_t> costs) {
  RETURN_IF_ERROR(CheckOptions(options, cap_required, balancing));
  const int64_t n = static_cast<int64_t>(lengths.size());
  if (!costs.empty() && static_cast<int64_t>(costs.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("costs has ", costs.size(), " entries for ", n,
                                                   " lengths; give one per sequence or none"));
  }
  if (n > kMaxSequences) {
    return absl::InvalidArgumentError(
        absl::StrCat("lengths has ", n, " entries, more than the limit ", kMaxSequences));
  }
  Validated v;
  v.options = options;
  v.options.align_to = EffectiveAlignTo(options);
  v.num_sequences = n;
  const int64_t cap = options.cap_mode == CapMode::kTokens
                          ? RoundDown(options.max_token_len, options.align_total_to)
                          : options.max_token_len;
  v.capacity = Capacity(cap, options.cap_mode, options.max_seqs_per_micro_batch);

  int64_t total_cost = 0;
  v.items.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t length = lengths[i];
    if (length < 1 || length > kMaxLength) {
      return absl::InvalidArgumentError(
          absl::StrCat("lengths[", i, "] = ", length, ": must be in [1, ", kMaxLength, "]"));
    }
    const std::optional<int64_t> aligned = CheckedRoundUp(length, v.options.align_to);
    const std::optional<int64_t> total =
        aligned ? CheckedRoundUp(*aligned, options.align_total_to) : std::nullopt;
    if (!total || *total > kMaxLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lengths[", i, "] = ", length, " aligned to align_to = ", v.options.align_to,
          " and align_total_to = ", options.align_total_to, " exceeds the limit ", kMaxLength));
    }
    std::optional<int64_t> cost;
    if (costs.empty()) {
      cost = CostOf(v.options, *aligned);
    } else if (costs[i] >= 0 && costs[i] <= kMaxGivenCost) {
      cost = costs[i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("costs[", i, "] = ", costs[i], ": must be in [0, ", kMaxGivenCost, "]"));
    }
    const std::optional<int64_t> running = cost ? CheckedAdd(total_cost, *cost) : std::nullopt;
    if (!running) {
      return absl::InvalidArgumentError(
          absl::StrCat("the total ", Name(options.cost), " cost overflows int64 at lengths[", i,
                       "] = ", length, "; lower attention.linear/attention.quadratic"));
    }
    total_cost = *running;
    const Item item{i, length, *aligned, *cost};
    // equal_size promises counts, not the cap: nothing is overlong there.
    if (!options.equal_size && v.capacity.Overlong(*aligned)) {
      switch (options.overlong) {
        case OverlongPolicy::kReject:
          return absl::InvalidArgumentError(
              absl::StrCat("sequence ", i, " has length ", length, " (aligned ", *aligned,
                           ") over max_token_len = ", options.max_token_len,
                           options.cap_mode == CapMode::kTokens && cap != options.max_token_len
                               ? absl::StrCat(" (", cap, " after align_total_to)")
                               : std::string(),
                           "; raise the cap or set overlong to isolate or drop"));
        case OverlongPolicy::kIsolate:
          v.isolated.push_back(item);
          v.total_tokens += length;
          continue;
        case OverlongPolicy::kDrop:
          v.dropped.push_back(i);
          continue;
      }
    }
    v.items.push_back(item);
    v.total_tokens += length;
  }
  return v;
}

std::vector<PartLoad> LoadsOf(const Parts& parts, absl::Span<const Item> items) {
  std::vector<PartLoad> loads(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    for (int32_t i : parts[p]) loads[p].Add(items[i]);
  }
  return loads;
}

bool WithinCapacity(const Parts& parts, absl::Span<const Item> items, const Capacity& capacity) {
  for (const Part& part : parts) {  // one load at a time: nothing allocated
    PartLoad load;
    for (int32_t i : part) load.Add(items[i]);
    if (capacity.Over(load)) return false;
  }
  return true;
}

int64_t MaxCost(const Parts& parts, absl::Span<const Item> items) {
  int64_t best = 0;
  for (const Part& part : parts) {
    int64_t cost = 0;
    for (int32_t i : part) cost += items[i].cost;
    best = std::max(best, cost);
  }
  return best;
}

}  // namespace packsched::planner::internal

namespace packsched::planner {

absl::Status CheckOptions(const PlanOptions& options) {
  const bool balancing =
      options.algorithm == Algorithm::kKarmarkarKarp || options.algorithm == Algorithm::kLpt;
  return internal::CheckOptions(options, /*cap_required=*/false, balancing);
}

}  // namespace packsched::planner
