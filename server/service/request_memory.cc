#include "server/service/request_memory.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "server/base/checked_math.h"
#include "server/planner/options.h"
#include "server/planner/schema.h"
#include "server/service/convert.h"
#include "server/service/dynamic_cp.h"

namespace packsched::service {
namespace {

// Saturating arithmetic for the estimates (an estimate that overflows is simply too large).
int64_t SatAdd(int64_t a, int64_t b) {
  return CheckedAdd(a, b).value_or(std::numeric_limits<int64_t>::max());
}
int64_t SatMul(int64_t a, int64_t b) {
  return CheckedMul(a, b).value_or(std::numeric_limits<int64_t>::max());
}

// An upper bound on the planner's local bound over `lengths` with (validated) options `o`,
// before the rounding to divisible_by and min_micro_batches: see EstimatePlanMemory in
// request_memory.h.
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

// A forest's items for the estimate: its nodes and its rollouts (each costs about a sequence),
// the longest array of each (PACKSCHED_FOREST: the Nodes rows; the Rollouts and Checked rows),
// and its rollouts (the Rollouts row: at most one piece each). The row
//   X(node_len, 1, Nodes)
// expands, through PACKSCHED_ITEMS, to
//   nodes = std::max(nodes, forest.node_len_size());
#define PACKSCHED_ITEMS_Nodes(forest, nodes, rollouts, name) \
  (nodes) = std::max((nodes), (forest).name##_size());
#define PACKSCHED_ITEMS_Rollouts(forest, nodes, rollouts, name) \
  (rollouts) = std::max((rollouts), (forest).name##_size());
#define PACKSCHED_ITEMS_Checked PACKSCHED_ITEMS_Rollouts
#define PACKSCHED_ITEMS(name, number, Kind) PACKSCHED_ITEMS_##Kind(forest, nodes, rollouts, name)
#define PACKSCHED_ROLLOUTS_Rollouts(forest, rollouts, name) (rollouts) = (forest).name##_size();
#define PACKSCHED_ROLLOUTS(name, number, Kind) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_ROLLOUTS, Kind, Rollouts)(forest, rollouts, name)

int64_t ForestItems(const v1::Forest& forest) {
  int nodes = 0;
  int rollouts = 0;
  PACKSCHED_FOREST(PACKSCHED_ITEMS)
  return SatAdd(nodes, rollouts);
}

int64_t ForestRollouts(const v1::Forest& forest) {
  int64_t rollouts = 0;
  PACKSCHED_FOREST(PACKSCHED_ROLLOUTS)
  return rollouts;
}

RequestMemory MemoryOf(int64_t sequences, int64_t micro_batches, int64_t wire_bytes,
                       int64_t ranks = 0) {
  RequestMemory m;
  m.sequences = sequences;
  m.micro_batches = micro_batches;
  m.wire_bytes = wire_bytes;
  m.ranks = ranks;
  m.bytes = PeakBytes(sequences, micro_batches, wire_bytes, ranks);
  return m;
}

// The node occurrences a forest's pieces may hold (I and S in request_memory.h), O(N + R).
// `grouped`: BalanceBatch's group_ids cut every tree at its groups first, copying shared nodes,
// so every kept rollout's path counts in S, whether or not its tree fits the cap.
struct ForestEntries {
  int64_t isolated = 0;
  int64_t split = 0;
};

ForestEntries EntriesOf(const v1::Forest& forest, const planner::PlanOptions& o, bool grouped) {
  const int n = forest.node_len_size();
  if (forest.node_parent_size() != n) return {};
  int64_t room = std::numeric_limits<int64_t>::max();
  if (o.max_token_len > 0) {
    const int64_t align = planner::EffectiveAlignTo(o);
    const int64_t cap = o.max_token_len - o.max_token_len % std::max<int64_t>(o.align_total_to, 1);
    room = cap / align * align;
  }
  std::vector<int32_t> depth(n);  // nodes on the root path, the node included
  std::vector<int32_t> root(n);
  std::vector<int64_t> through(n);  // tokens on the root path, the node included
  std::vector<int64_t> tree(n, 0);  // per root: its tree's tokens
  for (int i = 0; i < n; ++i) {
    const int64_t parent = forest.node_parent(i);
    const int64_t len = forest.node_len(i);
    if (parent < -1 || parent >= i || len < 1 || len > planner::kMaxLength) return {};
    const bool is_root = parent < 0;
    depth[i] = is_root ? 1 : depth[parent] + 1;
    root[i] = is_root ? i : root[parent];
    through[i] = is_root ? len : SatAdd(through[parent], len);
    tree[root[i]] = SatAdd(tree[root[i]], len);
  }
  ForestEntries out;
  for (const int64_t leaf : forest.rollout_leaf()) {
    if (leaf < 0 || leaf >= n) return {};
    if (!grouped && tree[root[leaf]] <= room) continue;  // one piece: its nodes are counted in n
    if (through[leaf] > room) {
      if (o.overlong == planner::OverlongPolicy::kIsolate) out.isolated += depth[leaf];
    } else {
      out.split += depth[leaf];
    }
  }
  return out;
}

// `m` for a forest: the terms a forest adds (request_memory.h).
RequestMemory WithForest(RequestMemory m, const v1::Forest& forest,
                         const absl::StatusOr<planner::PlanOptions>& o, bool grouped = false) {
  m.forest = true;
  if (o.ok()) {
    const ForestEntries entries = EntriesOf(forest, *o, grouped);
    m.isolated_entries = entries.isolated;
    m.split_entries = entries.split;
  }
  m.bytes = SatAdd(SatAdd(m.bytes, SatMul(kPeakPerTreeMicroBatch, m.micro_batches)),
                   SatAdd(SatMul(kPeakPerIsolatedEntry, m.isolated_entries),
                          SatMul(kPeakPerSplitEntry, m.split_entries)));
  return m;
}

}  // namespace

int64_t PeakBytes(int64_t sequences, int64_t micro_batches, int64_t wire_bytes, int64_t ranks) {
  return SatAdd(
      SatAdd(SatAdd(kPeakBase, SatMul(kPeakPerSequence, sequences)), SatMul(kPeakPerRank, ranks)),
      SatAdd(SatMul(kPeakPerMicroBatch, micro_batches), SatMul(kPeakPerWireByte, wire_bytes)));
}

// Options that validation refuses make the request fail before it allocates anything sized by
// them: they count no micro-batches.
RequestMemory EstimatePlanMemory(const v1::PlanRequest& request, const ServiceLimits& limits) {
  const absl::StatusOr<planner::PlanOptions> o =
      ToPlanOptions(request.options(), limits, /*planner_picks_k=*/true);
  if (request.has_forest()) {  // at most one piece per rollout
    const int64_t rollouts = ForestRollouts(request.forest());
    return WithForest(MemoryOf(ForestItems(request.forest()), o.ok() ? CountBound(*o, rollouts) : 0,
                               static_cast<int64_t>(request.ByteSizeLong())),
                      request.forest(), o);
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
  const RequestMemory m = MemoryOf(n, o.ok() && k >= 1 && k <= o->max_micro_batches ? k : 0,
                                   static_cast<int64_t>(request.ByteSizeLong()));
  return request.has_forest() ? WithForest(m, request.forest(), o) : m;
}

RequestMemory EstimateBalanceBatchMemory(const v1::BalanceBatchRequest& request,
                                         const ServiceLimits& limits) {
  const int64_t n = request.has_forest() ? ForestItems(request.forest()) : request.lengths().size();
  const int64_t world_size = request.world_size();
  const absl::StatusOr<planner::PlanOptions> o =
      ToPlanOptions(request.options(), limits, /*planner_picks_k=*/true);
  int64_t parts = 0;
  int64_t ranks = 0;
  if (o.ok() && world_size >= 1 && world_size <= planner::kMaxWorldSize && request.has_forest()) {
    ranks = world_size;
    // Every rank may hold every piece (at most one a rollout).
    parts = SatMul(world_size, CountBound(*o, ForestRollouts(request.forest())));
  } else if (o.ok() && world_size >= 1 && world_size <= planner::kMaxWorldSize) {
    ranks = world_size;
    // The largest rank's share: ceil(n / W), or all of them with groups (a group stays whole).
    const int64_t share = request.group_ids().empty() ? CeilDiv(n, world_size) : n;
    int64_t per_rank = CountBound(*o, std::min(share, ItemPartsBound(request.lengths(), *o)));
    // Sync step without groups may take one step of divisible_by above the k bound, within
    // max_micro_batches over all ranks; never with one sequence a rank (that plan is optimal).
    const int64_t wider = SatAdd(per_rank, o->divisible_by);
    if (request.sync() != v1::SYNC_MICRO_BATCH && request.group_ids().empty() && share > 1 &&
        SatMul(world_size, wider) <= o->max_micro_batches) {
      per_rank = wider;
    }
    parts = SatMul(world_size, per_rank);
  }
  const RequestMemory m = MemoryOf(n, parts, static_cast<int64_t>(request.ByteSizeLong()), ranks);
  return request.has_forest()
             ? WithForest(m, request.forest(), o, /*grouped=*/!request.group_ids().empty())
             : m;
}

RequestMemory EstimateDynamicCpMemory(const v1::PlanDynamicCpRequest& request,
                                      const ServiceLimits& limits) {
  const int64_t n = request.lengths_size();
  const int64_t wire = static_cast<int64_t>(request.ByteSizeLong());
  planner::CpModelLinks links;
  const absl::StatusOr<planner::DynamicCpOptions> o =
      ToDynamicCpOptions(request.options(), request.world_size(), links);
  // Values validation refuses count nothing (a divisible_by above the ceiling: no slots).
  if (!o.ok() || o->divisible_by < 1 || o->divisible_by > limits.max_micro_batches) {
    return MemoryOf(n, 0, wire);
  }
  RequestMemory m =
      MemoryOf(n, SatMul(CeilDiv(std::max<int64_t>(n, 1), o->divisible_by), o->divisible_by), wire);
  if (o->ranks >= 1 && o->ranks <= planner::kMaxWorldSize && o->min_cp >= 1) {
    m.ranks = o->ranks;
    m.bytes = SatAdd(
        m.bytes, SatMul(kPeakPerCpGroup, SatMul(o->divisible_by, CeilDiv(o->ranks, o->min_cp))));
  }
  return m;
}

int64_t DynamicCpGroupsReserved(int64_t sequences, const planner::DynamicCpOptions& options) {
  if (options.ranks < 1 || options.ranks > planner::kMaxWorldSize || options.min_cp < 1 ||
      options.divisible_by < 1 || sequences < 0) {
    return planner::kMaxCpGroups;
  }
  const int64_t idle = SatMul(options.divisible_by, CeilDiv(options.ranks, options.min_cp));
  return std::min(planner::kMaxCpGroups, SatAdd(sequences, idle));
}

int64_t DynamicCpResponseBytes(int64_t views, int64_t entries) {
  return SatAdd(SatMul(kPeakPerCpView, views), SatMul(kPeakPerCpSequenceView, entries));
}

}  // namespace packsched::service
