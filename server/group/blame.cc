#include "server/group/blame.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace packsched::group {
namespace {

// Ranks named in one message at most; the rest are counted.
constexpr size_t kNamedRanks = 16;

}  // namespace

std::optional<std::string> MissingRanks(CleanupCalls& cleanup, int64_t world_size,
                                        const std::function<std::string(int64_t)>& key) {
  std::vector<int64_t> missing;
  int64_t unnamed = 0;
  for (int64_t rank = 0; rank < world_size; ++rank) {
    absl::StatusOr<std::optional<std::string>> value = cleanup.TryGet(key(rank));
    if (!value.ok()) return std::nullopt;  // a store error says nothing about the rank
    if (value->has_value()) continue;
    if (missing.size() < kNamedRanks) {
      missing.push_back(rank);
    } else {
      ++unnamed;
    }
  }
  std::string text = absl::StrCat("[", absl::StrJoin(missing, ", "));
  if (unnamed > 0) absl::StrAppend(&text, ", and ", unnamed, " more");
  return absl::StrCat(text, "]");
}

std::string StoreUnreachable(const absl::Status& error) {
  return absl::StrCat("rendezvous store (rank 0) unreachable: ", error.message());
}

}  // namespace packsched::group
