// Tree-packed varlen attention (attention.h, "Tree packing") on the CPU backend: against the
// float64 naive reference with the tree rule, and against its definition, each rollout run on its
// own with causal attention (forward and backward); plus the flat case, validation and value
// checks.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packsched/kernels/attention.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/host_tensor.h"
#include "tests/kernels/tree_forest.h"

namespace packsched::kernels {
namespace {

using testing::AttentionTensors;
using testing::CheckAgainstReference;
using testing::Inputs;
using testing::MakeProblem;
using testing::Outputs;
using testing::PackedForest;
using testing::Problem;
using testing::RandomForest;
using testing::RandomInputs;
using testing::TreeProblem;

TEST(AttentionTreeTest, RandomForestsMatchTheReferenceInEveryDtype) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const PackedForest f = RandomForest(seed, 3, 12, 40);
    Problem p = TreeProblem(f.cu, f.subtree_end, f.positions);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ", rows " << f.cu.back());
    CheckAgainstReference<double>(p, seed);
    CheckAgainstReference<Bf16>(p, seed);
    CheckAgainstReference<Fp16>(p, seed);
  }
}

TEST(AttentionTreeTest, GqaWindowAndSoftcap) {
  const PackedForest f = RandomForest(7, 2, 16, 50);
  Problem p = TreeProblem(f.cu, f.subtree_end, f.positions);
  p.heads = 6;
  p.kv_heads = 2;
  p.head_dim = 32;
  p.options.window_left = 37;
  p.options.softcap = 2.5;
  CheckAgainstReference<double>(p);
  CheckAgainstReference<Bf16>(p);
  CheckAgainstReference<float>(p);
}

// The align_total_to tail after a forest: never keys, out 0 / lse +inf, zero gradients; its
// subtree_end and positions are not read.
TEST(AttentionTreeTest, TailAfterAForest) {
  const PackedForest f = RandomForest(12, 2, 8, 30);
  Problem p = TreeProblem(f.cu, f.subtree_end, f.positions);
  p.tail_q = p.tail_k = 70;
  p.subtree_end.insert(p.subtree_end.end(), 70, -1);
  p.positions.insert(p.positions.end(), 70, -1);
  p.options.window_left = 20;
  CheckAgainstReference<float>(p);
  CheckAgainstReference<double>(p);
}

// The aligned layout (pad slots after each piece, passed with seqused): pad slots are never keys
// and see no key, as without a tree; their subtree_end and positions are not read.
TEST(AttentionTreeTest, PadSlotsOfTheAlignedLayout) {
  const PackedForest f = RandomForest(13, 3, 8, 30);
  const std::vector<int32_t> pads = {5, 0, 64};
  Problem p = TreeProblem(f.cu, {}, {});
  p.pad_q = p.pad_k = pads;
  const std::vector<int32_t> cu_padded = p.CuQ();
  p.subtree_end.assign(cu_padded.back(), -1);
  p.positions.assign(cu_padded.back(), -1);
  for (size_t b = 0; b + 1 < f.cu.size(); ++b) {
    const int32_t shift = cu_padded[b] - f.cu[b];
    for (int32_t t = f.cu[b]; t < f.cu[b + 1]; ++t) {
      p.subtree_end[t + shift] = f.subtree_end[t] + shift;
      p.positions[t + shift] = f.positions[t];
    }
  }
  p.heads = 4;
  p.kv_heads = 2;
  CheckAgainstReference<double>(p);
  p.options.window_left = 17;
  CheckAgainstReference<Bf16>(p);
}

// A flat sequence (every subtree_end the end of the sequence) is plain causal attention, bit for
// bit.
TEST(AttentionTreeTest, FlatSequencesArePlainCausal) {
  Problem p = MakeProblem({97, 130, 1}, {97, 130, 1}, true);
  const std::vector<int32_t> cu = p.CuQ();
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    for (int32_t t = cu[b]; t < cu[b + 1]; ++t) {
      p.subtree_end.push_back(cu[b + 1]);
      p.positions.push_back(t - cu[b]);
    }
  }
  Problem plain = p;
  plain.subtree_end.clear();
  plain.positions.clear();
  const Inputs in = RandomInputs<float>(p, 5);
  AttentionTensors<float> tree(p, in), flat(plain, in);
  ASSERT_TRUE(tree.Forward(p.options).ok());
  ASSERT_TRUE(tree.Backward(p.options).ok());
  ASSERT_TRUE(flat.Forward(plain.options).ok());
  ASSERT_TRUE(flat.Backward(plain.options).ok());
  const Outputs a = tree.Results(), b = flat.Results();
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

// The definition: every rollout run on its own (its rows gathered into a sequence of their own,
// plain causal attention) gives the tree call's out and lse on its rows; and with each copy of a
// shared row given dout / (rollouts through the row), the gradients summed over the copies are
// the tree call's gradients.
void CheckAgainstRollouts(const PackedForest& f, int64_t window_left, double softcap) {
  Problem tree = TreeProblem(f.cu, f.subtree_end, f.positions);
  tree.heads = 4;
  tree.kv_heads = 2;
  tree.head_dim = 16;
  tree.options.window_left = window_left;
  tree.options.softcap = softcap;
  const Inputs in = RandomInputs<double>(tree, 11);
  AttentionTensors<double> packed(tree, in);
  ASSERT_TRUE(packed.Forward(tree.options).ok());
  ASSERT_TRUE(packed.Backward(tree.options).ok());
  const Outputs got = packed.Results();

  std::vector<int32_t> lens;
  std::vector<int64_t> source;  // packed row of each unpacked row
  for (const auto& rows : f.rollout_rows) {
    lens.push_back(static_cast<int32_t>(rows.size()));
    source.insert(source.end(), rows.begin(), rows.end());
  }
  std::vector<int> copies(f.subtree_end.size(), 0);
  for (int64_t r : source) ++copies[r];
  Problem flat = MakeProblem(lens, lens, true);
  flat.heads = tree.heads;
  flat.kv_heads = tree.kv_heads;
  flat.head_dim = tree.head_dim;
  flat.options = tree.options;
  flat.max_seqlen_k = tree.MaxSeqlenK();  // the same window normalisation
  const int64_t H = tree.heads, Hk = tree.kv_heads, D = tree.head_dim;
  Inputs unpacked;
  for (int64_t r : source) {
    for (int64_t i = 0; i < H * D; ++i) {
      unpacked.q.push_back(in.q[r * H * D + i]);
      unpacked.dout.push_back(in.dout[r * H * D + i] / copies[r]);
    }
    for (int64_t i = 0; i < Hk * D; ++i) {
      unpacked.k.push_back(in.k[r * Hk * D + i]);
      unpacked.v.push_back(in.v[r * Hk * D + i]);
    }
  }
  AttentionTensors<double> one_by_one(flat, unpacked);
  ASSERT_TRUE(one_by_one.Forward(flat.options).ok());
  ASSERT_TRUE(one_by_one.Backward(flat.options).ok());
  const Outputs want = one_by_one.Results();

  const int64_t tq = static_cast<int64_t>(f.subtree_end.size());
  const int64_t tu = static_cast<int64_t>(source.size());
  std::vector<double> dq(tq * H * D, 0), dk(tq * Hk * D, 0), dv(tq * Hk * D, 0);
  double err = 0;
  for (int64_t u = 0; u < tu; ++u) {
    const int64_t r = source[u];
    for (int64_t i = 0; i < H * D; ++i) {
      err = std::max(err, std::abs(got.out[r * H * D + i] - want.out[u * H * D + i]));
      dq[r * H * D + i] += want.dq[u * H * D + i];
    }
    for (int64_t h = 0; h < H; ++h) {
      err = std::max(err, std::abs(got.lse[h * tq + r] - want.lse[h * tu + u]));
    }
    for (int64_t i = 0; i < Hk * D; ++i) {
      dk[r * Hk * D + i] += want.dk[u * Hk * D + i];
      dv[r * Hk * D + i] += want.dv[u * Hk * D + i];
    }
  }
  EXPECT_LT(err, 1e-12) << "out / lse";
  // Rows on no rollout's path (none here: every node is on some path) would have zero gradients.
  for (size_t i = 0; i < dq.size(); ++i) ASSERT_NEAR(got.dq[i], dq[i], 1e-12) << "dq " << i;
  for (size_t i = 0; i < dk.size(); ++i) ASSERT_NEAR(got.dk[i], dk[i], 1e-12) << "dk " << i;
  for (size_t i = 0; i < dv.size(); ++i) ASSERT_NEAR(got.dv[i], dv[i], 1e-12) << "dv " << i;
}

TEST(AttentionTreeTest, EqualsEachRolloutOnItsOwn) {
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE(seed);
    CheckAgainstRollouts(RandomForest(seed, 3, 10, 70), -1, 0.0);
  }
}

TEST(AttentionTreeTest, EqualsEachRolloutOnItsOwnWithWindowAndSoftcap) {
  CheckAgainstRollouts(RandomForest(9, 2, 14, 60), 45, 3.0);
  CheckAgainstRollouts(RandomForest(10, 2, 14, 60), 0, 0.0);
}

MATCHER_P(InvalidArgumentWith, text, "") {
  *result_listener << "status: " << arg;
  return arg.code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.message()).find(text) != std::string::npos;
}

// The query-row map (AttentionSeqlens::query_rows): with dout 0 outside the map, the mapped rows'
// out, lse and dq and all of dk, dv are bitwise the call's without the map; every other row is a
// query that sees no key (out 0, lse +inf, dq 0). Runs of mapped rows start and end inside the
// 64-row query tiles and cross them.
TEST(AttentionTreeTest, QueryRowMapComputesOnlyItsRowsBitwise) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE(seed);
    const PackedForest f = RandomForest(seed, 3, 12, 40);
    Problem p = TreeProblem(f.cu, f.subtree_end, f.positions);
    p.heads = 4;
    p.kv_heads = 2;
    p.head_dim = 16;
    p.options.window_left = seed == 2 ? 30 : -1;
    p.options.softcap = seed == 3 ? 2.0 : 0.0;
    const int64_t tq = static_cast<int64_t>(f.subtree_end.size());
    std::vector<int32_t> rows;
    std::vector<bool> mapped(tq, false);
    for (int64_t t = 0; t < tq; ++t) {
      if ((t / (7 + seed)) % 3 != 1) {
        rows.push_back(static_cast<int32_t>(t));
        mapped[t] = true;
      }
    }
    Inputs in = RandomInputs<double>(p, seed);
    const int64_t H = p.heads, D = p.head_dim;
    for (int64_t t = 0; t < tq; ++t) {
      for (int64_t i = 0; !mapped[t] && i < H * D; ++i) in.dout[t * H * D + i] = 0;
    }
    AttentionTensors<double> all(p, in);
    ASSERT_TRUE(all.Forward(p.options).ok());
    ASSERT_TRUE(all.Backward(p.options).ok());
    AttentionTensors<double> own(p, in);
    testing::HostTensor map = testing::CuTensor(rows);
    own.seqlens.query_rows = &map.view();
    ASSERT_TRUE(own.Forward(p.options).ok());
    ASSERT_TRUE(own.Backward(p.options).ok());
    const Outputs want = all.Results();
    const Outputs got = own.Results();
    for (int64_t t = 0; t < tq; ++t) {
      for (int64_t i = 0; i < H * D; ++i) {
        const int64_t x = t * H * D + i;
        ASSERT_EQ(got.out[x], mapped[t] ? want.out[x] : 0.0) << "out row " << t;
        ASSERT_EQ(got.dq[x], mapped[t] ? want.dq[x] : 0.0) << "dq row " << t;
      }
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_EQ(got.lse[h * tq + t], mapped[t] ? want.lse[h * tq + t] : INFINITY)
            << "lse row " << t;
      }
    }
    ASSERT_EQ(got.dk, want.dk);
    ASSERT_EQ(got.dv, want.dv);
  }
}

TEST(AttentionTreeTest, QueryRowMapValidation) {
  const PackedForest f = RandomForest(3, 2, 6, 9);
  Problem p = TreeProblem(f.cu, f.subtree_end, f.positions);
  p.head_dim = 8;
  const Inputs in = RandomInputs<float>(p, 1);
  const int32_t rows = static_cast<int32_t>(f.subtree_end.size());
  for (const auto& [map, text] : std::vector<std::pair<std::vector<int32_t>, std::string>>{
           {{2, 2}, "query_rows[1] = 2 is outside [3, "},
           {{0, rows}, absl::StrCat("query_rows[1] = ", rows, " is outside")},
           {{-1}, "query_rows[0] = -1"}}) {
    AttentionTensors<float> t(p, in);
    testing::HostTensor m = testing::CuTensor(map);
    t.seqlens.query_rows = &m.view();
    EXPECT_THAT(t.Forward(p.options), InvalidArgumentWith(text));
    EXPECT_THAT(t.Backward(p.options), InvalidArgumentWith(text));
  }
}

TEST(AttentionTreeTest, ValidationNamesTheArgument) {
  const PackedForest f = RandomForest(3, 2, 6, 9);
  Problem p = TreeProblem(f.cu, f.subtree_end, f.positions);
  p.head_dim = 8;
  const Inputs in = RandomInputs<float>(p, 1);
  {
    AttentionTensors<float> t(p, in);
    AttentionOptions o = p.options;
    o.causal = false;
    EXPECT_THAT(t.Forward(o), InvalidArgumentWith("needs causal = true"));
    EXPECT_THAT(t.Backward(o), InvalidArgumentWith("needs causal = true"));
  }
  {
    AttentionTensors<float> t(p, in);
    t.seqlens.positions = nullptr;
    AttentionOptions o = p.options;
    o.window_left = 2;
    EXPECT_THAT(t.Forward(o), InvalidArgumentWith("positions is required"));
    o.window_left = 1 << 20;  // unbounded (>= max_seqlen_k): positions are not needed
    EXPECT_TRUE(t.Forward(o).ok());
  }
  {
    AttentionTensors<float> t(p, in);
    t.seqlens.subtree_end = nullptr;
    EXPECT_THAT(t.Forward(p.options), InvalidArgumentWith("positions is given without"));
  }
  {
    AttentionTensors<float> t(p, in);
    std::vector<int32_t> other = t.cu_k_values;
    other[1] -= 1;
    other[2] -= 1;
    testing::HostTensor cu = testing::CuTensor(other);
    t.seqlens.k.cu_seqlens = &cu.view();
    EXPECT_THAT(t.Forward(p.options), InvalidArgumentWith("k has"));
  }
  {
    Problem bad = p;
    bad.subtree_end[1] = 1;  // not past its row
    AttentionTensors<float> t(bad, in);
    EXPECT_THAT(t.Forward(p.options), InvalidArgumentWith("subtree_end[1] = 1"));
    bad.subtree_end[1] = f.cu[1] + 1;  // past its sequence
    AttentionTensors<float> u(bad, in);
    EXPECT_THAT(u.Forward(p.options), InvalidArgumentWith("subtree_end[1]"));
  }
  {
    Problem bad = p;
    bad.positions[2] = 3;  // deeper than its index
    AttentionTensors<float> t(bad, in);
    AttentionOptions o = p.options;
    o.window_left = 1;
    EXPECT_THAT(t.Forward(o), InvalidArgumentWith("positions[2] = 3"));
  }
  {
    Problem wrong = p;
    wrong.subtree_end.pop_back();
    AttentionTensors<float> t(wrong, in);
    EXPECT_THAT(t.Forward(p.options), InvalidArgumentWith("subtree_end"));
  }
}

TEST(AttentionTreeTest, TreeNeedsTheSelfAttentionLayout) {
  Problem p = MakeProblem({5, 3}, {4, 4}, true);
  p.head_dim = 8;
  p.subtree_end = {5, 5, 5, 5, 5, 8, 8, 8};
  const Inputs in = RandomInputs<float>(p, 1);
  AttentionTensors<float> t(p, in);
  EXPECT_THAT(t.Forward(p.options), InvalidArgumentWith("self-attention layout"));
}

}  // namespace
}  // namespace packsched::kernels
