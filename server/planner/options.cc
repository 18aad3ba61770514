#include "server/planner/options.h"

#include <array>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace packsched::planner {
namespace {

template <typename Enum, size_t N>
using NameTable = std::array<std::pair<Enum, absl::string_view>, N>;

constexpr NameTable<CapMode, 2> kCapModes = {
    {{CapMode::kTokens, "tokens"}, {CapMode::kPadded, "padded"}}};
constexpr NameTable<Algorithm, 5> kAlgorithms = {{{Algorithm::kKarmarkarKarp, "kk"},
                                                  {Algorithm::kLpt, "lpt"},
                                                  {Algorithm::kFirstFitDecreasing, "ffd"},
                                                  {Algorithm::kBestFitDecreasing, "bfd"},
                                                  {Algorithm::kSequential, "sequential"}}};
constexpr NameTable<CostModel, 2> kCostModels = {
    {{CostModel::kTokens, "tokens"}, {CostModel::kAttention, "attention"}}};
constexpr NameTable<OverlongPolicy, 3> kOverlongPolicies = {{{OverlongPolicy::kReject, "reject"},
                                                             {OverlongPolicy::kIsolate, "isolate"},
                                                             {OverlongPolicy::kDrop, "drop"}}};
constexpr NameTable<PartOrder, 3> kPartOrders = {{{PartOrder::kCostDesc, "cost_desc"},
                                                  {PartOrder::kIndex, "index"},
                                                  {PartOrder::kInterleave, "interleave"}}};
constexpr NameTable<Sync, 2> kSyncs = {{{Sync::kStep, "step"}, {Sync::kMicroBatch, "micro_batch"}}};

template <typename Enum, size_t N>
absl::string_view Lookup(const NameTable<Enum, N>& table, Enum v) {
  for (const auto& [value, name] : table) {
    if (value == v) return name;
  }
  return "unknown";
}

template <typename Enum, size_t N>
absl::StatusOr<Enum> Parse(const NameTable<Enum, N>& table, absl::string_view what,
                           absl::string_view name) {
  for (const auto& [value, known] : table) {
    if (known == name) return value;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", name, "' is not one of ",
                   absl::StrJoin(table, ", ", [](std::string* out, const auto& entry) {
                     absl::StrAppend(out, entry.second);
                   })));
}

using I128 = __int128;

// Scores(n, w) of options.h: n^2 while n <= w, else w^2 + (2w - 1)(n - w).
I128 WindowScores(I128 n, I128 w) { return n <= w ? n * n : w * w + (2 * w - 1) * (n - w); }

// Chunks(n, c) of options.h: (n / c) c^2 + (n mod c)^2.
I128 ChunkScores(I128 n, I128 c) { return (n / c) * c * c + (n % c) * (n % c); }

}  // namespace

int64_t ParallelAlign(const PlanOptions& o) {
  return o.context_parallel > 1 ? 2 * o.context_parallel * o.tensor_parallel : o.tensor_parallel;
}

int64_t EffectiveAlignTo(const PlanOptions& o) {
  return o.align_to == 1 ? ParallelAlign(o) : o.align_to;
}

absl::string_view Name(CapMode v) { return Lookup(kCapModes, v); }
absl::string_view Name(Algorithm v) { return Lookup(kAlgorithms, v); }
absl::string_view Name(CostModel v) { return Lookup(kCostModels, v); }
absl::string_view Name(OverlongPolicy v) { return Lookup(kOverlongPolicies, v); }
absl::string_view Name(PartOrder v) { return Lookup(kPartOrders, v); }
absl::string_view Name(Sync v) { return Lookup(kSyncs, v); }

absl::StatusOr<CapMode> ParseCapMode(absl::string_view n) {
  return Parse(kCapModes, "cap_mode", n);
}
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view n) {
  return Parse(kAlgorithms, "algorithm", n);
}
absl::StatusOr<CostModel> ParseCostModel(absl::string_view n) {
  return Parse(kCostModels, "cost", n);
}
absl::StatusOr<OverlongPolicy> ParseOverlongPolicy(absl::string_view n) {
  return Parse(kOverlongPolicies, "overlong", n);
}
absl::StatusOr<PartOrder> ParsePartOrder(absl::string_view n) {
  return Parse(kPartOrders, "order", n);
}
absl::StatusOr<Sync> ParseSync(absl::string_view n) { return Parse(kSyncs, "sync", n); }

std::optional<int64_t> AttentionScores(const AttentionCost& a, int64_t from, int64_t to) {
  // Each weight is below 2^33 and each difference below 2^63: every product fits in 128 bits.
  I128 sum = I128{a.quadratic} * (I128{to} * to - I128{from} * from);
  if (a.windowed > 0) {
    sum += I128{a.windowed} * (WindowScores(to, a.window) - WindowScores(from, a.window));
  }
  if (a.chunked > 0) {
    sum += I128{a.chunked} * (ChunkScores(to, a.chunk) - ChunkScores(from, a.chunk));
  }
  if (sum > std::numeric_limits<int64_t>::max()) return std::nullopt;
  return static_cast<int64_t>(sum);
}

}  // namespace packsched::planner
