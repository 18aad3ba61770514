#include "server/planner/options.h"

#include <array>
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

}  // namespace packsched::planner
