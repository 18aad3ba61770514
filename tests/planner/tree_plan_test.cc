// Tree packing's plan: forests validated with errors naming the node or rollout, pieces
// within the cap, each token forwarded once per piece, rows that restore every rollout, the
// mask rule equal to each rollout alone, the cost formula, and determinism.

#include "server/planner/tree_plan.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/forest.h"
#include "server/planner/loss_weights.h"
#include "server/planner/planner.h"
#include "tests/planner/forest_fixtures.h"

namespace packsched::planner {
namespace {

using testing_forests::Groups;

using ::testing::HasSubstr;

void ExpectInvalid(const absl::Status& status, const std::string& mentions) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(mentions));
}

PlanOptions Capped(int64_t cap) {
  PlanOptions o;
  o.max_token_len = cap;
  return o;
}

// A random forest: each node hangs under an earlier node of its tree or starts a tree; every
// leaf is a rollout, and some inner nodes too.
Forest RandomForest(std::mt19937_64& rng, int64_t nodes, int64_t max_len) {
  Forest f;
  std::uniform_int_distribution<int64_t> len(1, max_len);
  for (int64_t n = 0; n < nodes; ++n) {
    f.node_len.push_back(len(rng));
    const bool root = n == 0 || rng() % 5 == 0;
    f.node_parent.push_back(root ? -1 : static_cast<int64_t>(rng() % n));
  }
  std::vector<bool> inner(nodes, false);
  for (int64_t n = 0; n < nodes; ++n) {
    if (f.node_parent[n] >= 0) inner[f.node_parent[n]] = true;
  }
  for (int64_t n = 0; n < nodes; ++n) {
    if (!inner[n] || rng() % 4 == 0) f.rollout_leaf.push_back(n);
    if (!inner[n] && rng() % 6 == 0) f.rollout_leaf.push_back(n);  // a duplicate rollout
  }
  std::shuffle(f.rollout_leaf.begin(), f.rollout_leaf.end(), rng);
  return f;
}

// Rollout r's tokens as (node, offset) labels, root first.
std::vector<std::pair<int64_t, int64_t>> PathTokens(const Forest& f, int64_t r) {
  std::vector<int64_t> path;
  for (int64_t n = f.rollout_leaf[r]; n >= 0; n = f.node_parent[n]) path.push_back(n);
  std::vector<std::pair<int64_t, int64_t>> tokens;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    for (int64_t j = 0; j < f.node_len[*it]; ++j) tokens.emplace_back(*it, j);
  }
  return tokens;
}

bool IsAncestorOrSelf(const Forest& f, int64_t a, int64_t n) {
  for (; n >= 0; n = f.node_parent[n]) {
    if (n == a) return true;
  }
  return false;
}

// Everything a tree plan promises, checked from the forest alone. Returns "" when it holds.
std::string CheckTreePlan(const Forest& f, const PlanOptions& o, const TreePlan& plan,
                          bool check_mask) {
  const int64_t r_count = static_cast<int64_t>(f.rollout_leaf.size());
  const int64_t align = std::max<int64_t>(o.align_to, 1);
  const int64_t cap = o.max_token_len - o.max_token_len % o.align_total_to;
  std::vector<int> seen(r_count, 0);
  int64_t forwarded = 0;
  for (size_t p = 0; p < plan.parts.size(); ++p) {
    const TreeMicroBatch& part = plan.parts[p];
    const MicroBatch& b = part.batch;
    const TreeEntries l = Entries(part, f);
    if (o.max_token_len > 0 && !b.overlong && b.total > cap) return "a part passes the cap";
    if (l.piece_begin.size() != b.indices.size() + 1) return "piece_begin size";
    // Labels of every real row.
    std::vector<std::pair<int64_t, int64_t>> label(b.total, {-1, -1});
    std::vector<int64_t> piece_of(b.total, -1);
    for (size_t s = 0; s + 1 < l.piece_begin.size(); ++s) {
      int64_t tokens = 0;
      std::set<int64_t> nodes;
      for (int64_t e = l.piece_begin[s]; e < l.piece_begin[s + 1]; ++e) {
        if (!nodes.insert(l.nodes[e]).second) return "a node twice in one piece";
        for (int64_t j = 0; j < f.node_len[l.nodes[e]]; ++j) {
          if (label[l.row[e] + j].first != -1) return "a row of two entries";
          label[l.row[e] + j] = {l.nodes[e], j};
          piece_of[l.row[e] + j] = static_cast<int64_t>(s);
        }
        tokens += f.node_len[l.nodes[e]];
      }
      if (tokens != b.cu_seqlens[s + 1] - b.cu_seqlens[s]) return "piece tokens != cu_seqlens";
      const int64_t aligned = (tokens + align - 1) / align * align;
      if (aligned != b.cu_seqlens_aligned[s + 1] - b.cu_seqlens_aligned[s]) return "aligned";
      if (o.max_token_len > 0 && !b.overlong && aligned > cap) return "a piece passes the cap";
      forwarded += tokens;
    }
    const TreeRows rows = RowsOf(part, f);
    for (size_t i = 0; i < part.layout.rollouts.size(); ++i) {
      const int64_t r = part.layout.rollouts[i];
      ++seen[r];
      if (plan.rollout_part[r] != static_cast<int64_t>(p)) return "rollout_part";
      const std::vector<int64_t> rr = RolloutRows(l, f.node_len, i);
      const auto want = PathTokens(f, r);
      if (rr.size() != want.size()) return "rollout rows: wrong length";
      for (size_t t = 0; t < rr.size(); ++t) {
        if (label[rr[t]] != want[t]) return "rollout rows: wrong token";
        if (rows.position[rr[t]] != static_cast<int32_t>(t)) return "position != index in rollout";
        if (piece_of[rr[t]] != piece_of[rr[0]]) return "a rollout over two pieces";
      }
    }
    if (!check_mask) continue;
    for (int64_t i = 0; i < b.total; ++i) {
      for (int64_t j = 0; j < b.total; ++j) {
        if (piece_of[i] < 0 || piece_of[j] != piece_of[i]) continue;
        const bool visible = j <= i && i < rows.subtree_end[j];
        const auto [ni, oi] = label[i];
        const auto [nj, oj] = label[j];
        const bool want = ni == nj ? oj <= oi : IsAncestorOrSelf(f, nj, ni);
        if (visible != want) return "mask rule differs from the rollout's causal mask";
      }
    }
  }
  for (int64_t r = 0; r < r_count; ++r) {
    const bool dropped = std::binary_search(plan.dropped.begin(), plan.dropped.end(), r);
    if (seen[r] != (dropped ? 0 : 1)) return "a rollout not exactly once";
  }
  if (forwarded != plan.forwarded_tokens) return "forwarded_tokens";
  return "";
}

TEST(Forest, BadInputNamesTheNodeOrRollout) {
  ExpectInvalid(IndexForest({{4, 0, 2}, {-1, 0, 0}, {1}}).status(), "node 1 has node_len = 0");
  ExpectInvalid(IndexForest({{4, 3}, {-1, 5}, {1}}).status(), "node 1 has node_parent = 5");
  ExpectInvalid(IndexForest({{4, 3, 2}, {-1, 2, 0}, {1}}).status(), "node 1 has node_parent = 2");
  ExpectInvalid(IndexForest({{4, 3}, {1, 0}, {1}}).status(), "node 0 has node_parent = 1");
  ExpectInvalid(IndexForest({{4, 3}, {-1, 0}, {2}}).status(), "rollout 0 has rollout_leaf = 2");
  ExpectInvalid(IndexForest({{4, 3, 5}, {-1, 0, 0}, {1}}).status(), "node 2 is on no rollout");
  ExpectInvalid(IndexForest({{4, 3}, {-1, 0}, {1, 0}, {7, 5}}).status(),
                "rollout 1 declares rollout_len = 5 but its path to node 0 holds 4");
  ExpectInvalid(IndexForest({{4}, {-1, 0}, {0}}).status(), "node_parent has 2 entries");
  EXPECT_TRUE(IndexForest({{4, 3}, {-1, 0}, {1, 0}, {7, 4}}).ok());
}

TEST(Forest, IndexHasDepthsPreorderAndTotals) {
  // 0 -> {1 -> {3}, 2}; 4 alone.
  const Forest f{{5, 2, 3, 1, 6}, {-1, 0, 0, 1, -1}, {3, 2, 4}};
  const absl::StatusOr<ForestIndex> index = IndexForest(f);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->depth, (std::vector<int64_t>{0, 5, 5, 7, 0}));
  EXPECT_EQ(index->preorder, (std::vector<int64_t>{0, 1, 3, 2, 4}));
  EXPECT_EQ(index->rollout_len, (std::vector<int64_t>{8, 8, 6}));
  EXPECT_EQ(index->unique_tokens, 17);
  EXPECT_EQ(index->rollout_tokens, 22);
}

TEST(TreePlan, GroupsForwardTheirPromptOnce) {
  const Forest f = Groups({100, 60}, {{10, 20, 30}, {5, 5}});
  const absl::StatusOr<TreePlan> plan = PlanForest(f, Capped(1000));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->parts.size(), 1u);
  EXPECT_EQ(plan->forwarded_tokens, 100 + 60 + 60 + 10);
  EXPECT_EQ(plan->rollout_tokens, 3 * 100 + 60 + 2 * 60 + 10);
  EXPECT_EQ(CheckTreePlan(f, Capped(1000), *plan, /*check_mask=*/true), "");
  // Flat packing of the same rollouts needs more than one micro-batch under a cap of 300.
  const absl::StatusOr<TreePlan> tight = PlanForest(f, Capped(300));
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_EQ(tight->parts.size(), 1u);
  EXPECT_EQ(PlanMicroBatches({110, 120, 130, 65, 65}, Capped(300))->parts.size(), 2u);
}

TEST(TreePlan, OverCapTreeSplitsIntoPiecesOfWholeRollouts) {
  // 100 + 4 x 50 = 300 tokens under a cap of 220: pieces of at most two completions each.
  const Forest f = Groups({100}, {{50, 50, 50, 50}});
  const absl::StatusOr<TreeProblem> problem = TreeProblem::Create(f, Capped(220));
  ASSERT_TRUE(problem.ok()) << problem.status();
  ASSERT_EQ(problem->pieces().size(), 2u);
  for (const TreePiece& piece : problem->pieces()) {
    EXPECT_EQ(piece.tokens, 200);
    EXPECT_EQ(piece.nodes.front(), 0);  // the prompt, repeated
  }
  EXPECT_EQ(problem->pieces()[0].rollouts, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(problem->pieces()[1].rollouts, (std::vector<int64_t>{2, 3}));
  const absl::StatusOr<TreePlan> plan = problem->Partition(problem->local_k());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(CheckTreePlan(f, Capped(220), *plan, /*check_mask=*/true), "");
}

// The fewest tokens any cut of tree `root`'s rollouts into pieces within `cap` forwards (every
// rollout of it within the cap, at most 14 of them): a DP over the subsets of its rollouts, a
// piece forwarding the union of its rollouts' paths.
int64_t FewestTokens(const Forest& f, int64_t root, int64_t cap) {
  std::vector<int64_t> rollouts;
  for (size_t r = 0; r < f.rollout_leaf.size(); ++r) {
    if (IsAncestorOrSelf(f, root, f.rollout_leaf[r])) rollouts.push_back(static_cast<int64_t>(r));
  }
  const int m = static_cast<int>(rollouts.size());
  std::vector<int64_t> through(f.node_len.size(), 0);  // mask of the rollouts through a node
  for (int b = 0; b < m; ++b) {
    for (int64_t n = f.rollout_leaf[rollouts[b]]; n >= 0; n = f.node_parent[n]) {
      through[n] |= int64_t{1} << b;
    }
  }
  std::vector<int64_t> cost(size_t{1} << m, 0);
  for (int64_t s = 1; s < (int64_t{1} << m); ++s) {
    for (size_t n = 0; n < f.node_len.size(); ++n) {
      if (through[n] & s) cost[s] += f.node_len[n];
    }
  }
  std::vector<int64_t> best(size_t{1} << m, 0);
  for (int64_t s = 1; s < (int64_t{1} << m); ++s) {
    best[s] = INT64_MAX;
    const int64_t low = s & -s;
    for (int64_t sub = s; sub > 0; sub = (sub - 1) & s) {
      if ((sub & low) && cost[sub] <= cap && best[s ^ sub] != INT64_MAX) {
        best[s] = std::min(best[s], cost[sub] + best[s ^ sub]);
      }
    }
  }
  return best.back();
}

// An agent's trace: a trunk of turns from a system prompt, and at each turn a branch that ends
// there. Node lengths from `len`.
Forest Trace(int turns, const std::function<int64_t()>& len) {
  Forest f;
  auto node = [&](int64_t parent) {
    f.node_len.push_back(len());
    f.node_parent.push_back(parent);
    return static_cast<int64_t>(f.node_len.size()) - 1;
  };
  int64_t at = node(-1);
  for (int t = 0; t < turns; ++t) {
    f.rollout_leaf.push_back(node(at));  // the branch, numbered before the trunk goes on
    at = node(at);
  }
  f.rollout_leaf.push_back(at);
  return f;
}

TEST(TreePlan, SplitTraceRepeatsItsShortestPrefixes) {
  // 1,000 tokens a node, 4 turns: the trunk rollout holds 5,000 tokens, the tree 9,000. Under a
  // cap of 7,000 the best cut is the trunk with the two deepest branches, and the two branches
  // that leave it first with the 2,000-token prefix they share: 11,000 tokens. Taking the
  // rollouts in preorder instead (the shallow branches first) repeats a 4,000-token prefix.
  const Forest f = Trace(4, [] { return 1000; });
  const absl::StatusOr<TreePlan> plan = PlanForest(f, Capped(7000));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->forwarded_tokens, FewestTokens(f, 0, 7000));
  EXPECT_EQ(plan->forwarded_tokens, 11000);
  EXPECT_EQ(CheckTreePlan(f, Capped(7000), *plan, /*check_mask=*/true), "");

  // Traces of random lengths (at most 9 rollouts): cut at the fewest tokens possible.
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int64_t> len(50, 2000);
  for (int trial = 0; trial < 40; ++trial) {
    const Forest trace = Trace(3 + trial % 6, [&] { return len(rng); });
    const ForestIndex index = *IndexForest(trace);
    int64_t longest = 0;
    for (int64_t l : index.rollout_len) longest = std::max(longest, l);
    const int64_t cap = longest + static_cast<int64_t>(rng() % 3000);
    const absl::StatusOr<TreePlan> traced = PlanForest(trace, Capped(cap));
    ASSERT_TRUE(traced.ok()) << traced.status();
    EXPECT_EQ(CheckTreePlan(trace, Capped(cap), *traced, /*check_mask=*/false), "");
    EXPECT_EQ(traced->forwarded_tokens, FewestTokens(trace, 0, cap)) << "trial " << trial;
  }
}

TEST(TreePlan, OverlongRolloutFollowsThePolicy) {
  const Forest f = Groups({100}, {{50, 150, 20}});
  PlanOptions o = Capped(200);
  ExpectInvalid(PlanForest(f, o).status(), "rollout 1 has length 250");
  o.overlong = OverlongPolicy::kDrop;
  absl::StatusOr<TreePlan> plan = PlanForest(f, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dropped, (std::vector<int64_t>{1}));
  EXPECT_EQ(plan->forwarded_tokens, 170);  // the 150-token completion is not forwarded
  EXPECT_EQ(CheckTreePlan(f, o, *plan, /*check_mask=*/true), "");
  o.overlong = OverlongPolicy::kIsolate;
  plan = PlanForest(f, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->dropped.empty());
  int overlong = 0;
  for (const TreeMicroBatch& part : plan->parts) {
    if (!part.batch.overlong) continue;
    ++overlong;
    EXPECT_EQ(part.layout.rollouts, (std::vector<int64_t>{1}));
  }
  EXPECT_EQ(overlong, 1);
  EXPECT_EQ(CheckTreePlan(f, o, *plan, /*check_mask=*/true), "");
}

// A trunk with a rollout at every node, under a cap that isolates the deep ones: each isolated
// piece repeats the trunk above its rollout (about N^2 / 2 node occurrences), but the plan's
// layout holds one value per rollout and one per piece, and its entries, derived, still keep
// every promise.
TEST(TreePlan, LayoutIsLinearInTheForest) {
  const int64_t n = 400;
  Forest f;
  for (int64_t i = 0; i < n; ++i) {
    f.node_len.push_back(1);
    f.node_parent.push_back(i - 1);
    f.rollout_leaf.push_back(i);
  }
  PlanOptions o = Capped(64);
  o.overlong = OverlongPolicy::kIsolate;
  const absl::StatusOr<TreePlan> plan = PlanForest(f, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t stored = 0, occurrences = 0;
  for (const TreeMicroBatch& part : plan->parts) {
    const TreeLayout& l = part.layout;
    stored += static_cast<int64_t>(l.rollouts.size() + l.piece_rollouts.size() +
                                   l.piece_rollout_begin.size());
    occurrences += static_cast<int64_t>(Entries(part, f).nodes.size());
  }
  EXPECT_GT(occurrences, n * (n - 64) / 2);  // the isolated rollouts' paths
  EXPECT_LE(stored, 4 * n);  // rollouts twice, piece offsets: at most one piece per rollout
  EXPECT_EQ(CheckTreePlan(f, o, *plan, /*check_mask=*/false), "");
  // Token accounting over rollouts: logical = every rollout's path, forwarded = the pieces'.
  const MicroBatchPlan view = RolloutView(*plan, *IndexForest(f));
  EXPECT_EQ(view.stats.total_tokens, n * (n + 1) / 2);
  EXPECT_EQ(view.stats.forwarded_tokens, plan->forwarded_tokens);
  EXPECT_EQ(view.stats.forwarded_tokens, occurrences);  // one-token nodes
  EXPECT_EQ(view.stats.packed_tokens, plan->stats.packed_tokens);
}

// With CP every piece is aligned to 2 * cp * tp (the tree shard map cuts it into 2 * cp equal
// chunks) and costs 1 / cp of what it costs with cp = 1.
TEST(TreePlan, ContextParallelAlignsEveryPiece) {
  const Forest f = Groups({37, 11, 90}, {{5, 8, 13}, {3}, {41, 2}});
  PlanOptions flat = Capped(1024);
  flat.cost = CostModel::kAttention;
  flat.attention = {1, 1};
  flat.align_to = 4;
  PlanOptions o = flat;
  o.context_parallel = 2;
  const absl::StatusOr<TreePlan> plan = PlanForest(f, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(CheckTreePlan(f, o, *plan, /*check_mask=*/true), "");
  const absl::StatusOr<TreePlan> one = PlanForest(f, flat);
  ASSERT_TRUE(one.ok()) << one.status();
  int64_t pieces = 0;
  for (const TreeMicroBatch& part : plan->parts) {
    const std::vector<int32_t>& cu = part.batch.cu_seqlens_aligned;
    for (size_t b = 0; b + 1 < cu.size(); ++b) {
      EXPECT_EQ((cu[b + 1] - cu[b]) % 4, 0) << "piece " << b;
      ++pieces;
    }
  }
  EXPECT_EQ(pieces, 3);
  // Each piece's cost is floor(its cp = 1 cost / 2).
  EXPECT_LE(2 * plan->stats.total_cost, one->stats.total_cost);
  EXPECT_GT(2 * plan->stats.total_cost + pieces, one->stats.total_cost - 1);
  o.tensor_parallel = 2;
  o.align_to = 1;  // the default: 2 * cp * tp
  const absl::StatusOr<TreePlan> tp = PlanForest(f, o);
  ASSERT_TRUE(tp.ok()) << tp.status();
  for (const TreeMicroBatch& part : tp->parts) {
    for (int32_t offset : part.batch.cu_seqlens_aligned) EXPECT_EQ(offset % 8, 0);
  }
}

TEST(TreePlan, BadForestIsInvalidArgument) {
  ExpectInvalid(PlanForest({{4, 3}, {-1, 0}, {3}}, Capped(100)).status(), "rollout 0");
}

// A forest of chains (one rollout per tree) is flat packing: the same k and the same costs.
TEST(TreePlan, ChainsPlanAsTheirSequences) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> lengths;
    Forest f;
    for (int i = 0; i < 40; ++i) {
      const int64_t len = 1 + static_cast<int64_t>(rng() % 900);
      lengths.push_back(len);
      f.node_len.push_back(len);
      f.node_parent.push_back(-1);
      f.rollout_leaf.push_back(i);
    }
    PlanOptions o = Capped(2048);
    o.cost = trial % 2 == 0 ? CostModel::kAttention : CostModel::kTokens;
    o.align_to = trial % 3 == 0 ? 8 : 1;
    const absl::StatusOr<TreePlan> tree = PlanForest(f, o);
    const absl::StatusOr<MicroBatchPlan> flat = PlanMicroBatches(lengths, o);
    ASSERT_TRUE(tree.ok() && flat.ok());
    ASSERT_EQ(tree->parts.size(), flat->parts.size());
    for (size_t p = 0; p < flat->parts.size(); ++p) {
      EXPECT_EQ(tree->parts[p].batch.cost, flat->parts[p].cost);
      EXPECT_EQ(tree->parts[p].layout.rollouts, flat->parts[p].indices);
    }
  }
}

// The attention cost counts each query token against its whole ancestor path: from the rows,
// sum over real rows of (2 x position + 1), plus the alignment padding as flat plans count it.
TEST(TreePlan, AttentionCostFromTheRows) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 30; ++trial) {
    const Forest f = RandomForest(rng, 30, 40);
    PlanOptions o = Capped(600);
    o.cost = CostModel::kAttention;
    o.attention = {.linear = 7, .quadratic = 3};
    o.align_to = trial % 2 == 0 ? 4 : 1;
    o.overlong = OverlongPolicy::kIsolate;
    const absl::StatusOr<TreePlan> plan = PlanForest(f, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const TreeMicroBatch& part : plan->parts) {
      const TreeRows rows = RowsOf(part, f);
      int64_t want = 0;
      for (size_t s = 0; s + 1 < part.batch.cu_seqlens.size(); ++s) {
        const int64_t tokens = part.batch.cu_seqlens[s + 1] - part.batch.cu_seqlens[s];
        const int64_t aligned =
            part.batch.cu_seqlens_aligned[s + 1] - part.batch.cu_seqlens_aligned[s];
        int64_t quad = aligned * aligned - tokens * tokens;
        for (int64_t t = 0; t < tokens; ++t) {
          quad += 2 * rows.position[part.batch.cu_seqlens_aligned[s] + t] + 1;
        }
        want += 7 * aligned + 3 * quad;
      }
      EXPECT_EQ(part.batch.cost, want);
    }
  }
}

TEST(TreePlan, RandomForestsKeepEveryPromise) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const Forest f = RandomForest(rng, 1 + static_cast<int64_t>(rng() % 40), 1 + rng() % 60);
    PlanOptions o = Capped(64 + static_cast<int64_t>(rng() % 400));
    o.align_to = std::vector<int64_t>{1, 2, 8}[trial % 3];
    o.align_total_to = trial % 4 == 0 ? 16 : 1;
    o.cost = trial % 2 == 0 ? CostModel::kAttention : CostModel::kTokens;
    o.algorithm = trial % 5 == 0 ? Algorithm::kLpt : Algorithm::kKarmarkarKarp;
    o.overlong = trial % 3 == 0 ? OverlongPolicy::kDrop : OverlongPolicy::kIsolate;
    const absl::StatusOr<TreePlan> plan = PlanForest(f, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(CheckTreePlan(f, o, *plan, /*check_mask=*/trial % 4 == 0), "") << "trial " << trial;
    const absl::StatusOr<TreePlan> again = PlanForest(f, o);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(again->parts.size(), plan->parts.size());
    for (size_t p = 0; p < plan->parts.size(); ++p) {
      EXPECT_EQ(Entries(again->parts[p], f).nodes, Entries(plan->parts[p], f).nodes);
      EXPECT_EQ(again->parts[p].layout.piece_rollouts, plan->parts[p].layout.piece_rollouts);
      EXPECT_EQ(again->parts[p].layout.rollouts, plan->parts[p].layout.rollouts);
    }
    // A tree within the cap is one piece: its tokens forwarded exactly once.
    const ForestIndex index = *IndexForest(f);
    std::map<int64_t, int64_t> tree_tokens;
    for (size_t n = 0; n < f.node_len.size(); ++n) tree_tokens[index.root[n]] += f.node_len[n];
    const absl::StatusOr<TreeProblem> problem = TreeProblem::Create(f, o);
    ASSERT_TRUE(problem.ok());
    for (const TreePiece& piece : problem->pieces()) {
      const int64_t cap = o.max_token_len - o.max_token_len % o.align_total_to;
      const int64_t whole = (tree_tokens[piece.root] + o.align_to - 1) / o.align_to * o.align_to;
      if (whole <= cap) {
        EXPECT_EQ(piece.tokens, tree_tokens[piece.root]);
      }
    }
  }
}

TEST(TreePlan, PackersAndFixedK) {
  std::mt19937_64 rng(5);
  const Forest f = RandomForest(rng, 40, 50);
  PlanOptions o = Capped(300);
  o.overlong = OverlongPolicy::kIsolate;
  o.algorithm = Algorithm::kBestFitDecreasing;
  const absl::StatusOr<TreePlan> packed = PackForest(f, o);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(CheckTreePlan(f, o, *packed, /*check_mask=*/false), "");
  o.algorithm = Algorithm::kKarmarkarKarp;
  const int64_t k = PlanForest(f, o)->parts.size() + 2;
  const absl::StatusOr<TreePlan> fixed = PartitionForestFixedK(f, k, o);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(static_cast<int64_t>(fixed->parts.size()), k);
  EXPECT_EQ(CheckTreePlan(f, o, *fixed, /*check_mask=*/false), "");
}

TEST(TreePlan, BalanceForestGivesEveryRankTheSameK) {
  std::mt19937_64 rng(9);
  for (Sync sync : {Sync::kStep, Sync::kMicroBatch}) {
    const Forest f = RandomForest(rng, 120, 80);
    PlanOptions o = Capped(400);
    o.overlong = OverlongPolicy::kIsolate;
    o.cost = CostModel::kAttention;
    const absl::StatusOr<BalancedForest> batch = BalanceForest(f, 4, o, {.sync = sync});
    ASSERT_TRUE(batch.ok()) << batch.status();
    std::vector<int> seen(f.rollout_leaf.size(), 0);
    for (const TreePlan& rank : batch->ranks) {
      EXPECT_EQ(static_cast<int64_t>(rank.parts.size()), batch->num_micro_batches);
      for (const TreeMicroBatch& part : rank.parts) {
        for (int64_t r : part.layout.rollouts) ++seen[r];
      }
      const TreePlan& plan = rank;
      for (size_t p = 0; p < plan.parts.size(); ++p) {
        for (size_t i = 0; i < plan.parts[p].layout.rollouts.size(); ++i) {
          const int64_t r = plan.parts[p].layout.rollouts[i];
          EXPECT_EQ(RolloutRows(Entries(plan.parts[p], f), f.node_len, i).size(),
                    PathTokens(f, r).size());
        }
      }
    }
    for (int s : seen) EXPECT_EQ(s, 1);
  }
}

TEST(TreePlan, AForestWithNoRolloutsIsNothingToPlan) {
  const Forest empty;
  ExpectInvalid(PlanForest(empty, Capped(100)).status(), "nothing to plan");
  PlanOptions packing = Capped(100);
  packing.algorithm = Algorithm::kFirstFitDecreasing;
  ExpectInvalid(PackForest(empty, packing).status(), "nothing to plan");
  ExpectInvalid(BalanceForest(empty, 2, Capped(100)).status(), "nothing to plan");
  // A rank with no rollouts joins a round: the problem and a fixed k take it.
  const absl::StatusOr<TreeProblem> problem = TreeProblem::Create(empty, Capped(100));
  ASSERT_TRUE(problem.ok()) << problem.status();
  const absl::StatusOr<TreePlan> fixed = PartitionForestFixedK(empty, 2, Capped(100));
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->parts.size(), 2u);
}

TEST(TreePlan, LossWeightsArePerRollout) {
  const Forest f = Groups({10, 20}, {{3, 4}, {5}});
  const absl::StatusOr<TreePlan> plan = PlanForest(f, Capped(30));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const MicroBatchPlan view = RolloutView(*plan, *IndexForest(f));
  const std::vector<int64_t> loss_tokens = {3, 4, 5};
  const absl::StatusOr<LossCounts> counts = CountLoss(view, loss_tokens);
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->loss_tokens, 12);
  EXPECT_EQ(counts->sequences_with_loss, 3);
  LossOptions lo;
  lo.mode = LossMode::kSampleMean;
  const absl::StatusOr<LossWeights> w = ComputeLossWeights(view, loss_tokens, lo, *counts, 1);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_DOUBLE_EQ(w->weights[0], 1.0 / (3 * 3));
  EXPECT_DOUBLE_EQ(w->weights[1], 1.0 / (4 * 3));
  EXPECT_DOUBLE_EQ(w->weights[2], 1.0 / (5 * 3));
}

}  // namespace
}  // namespace packsched::planner
