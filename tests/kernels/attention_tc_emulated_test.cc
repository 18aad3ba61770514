// The tensor-core attention kernels (kernels/cuda/attention_tc_fwd.cuh, attention_tc_bwd.cuh) run
// on the CPU under the warp-accurate emulation (cuda_emulation/warp_runtime.h and its ptx.cuh),
// over the launchers' grids, against the float64 reference with the tolerance rule of
// docs/design.md §4: every mask mode of the varlen API, GQA/MQA, seqused, the tail, and the tree
// rule of "Tree packing" (its reference: the naive attention under the tree predicate). Also
// checks that no ldmatrix phase of the kernels hits a shared-memory bank conflict.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "cuda_runtime.h"  // the emulation (this target's include path puts it first)
#include "gtest/gtest.h"
#include "kernels/cuda/attention_tc_bwd.cuh"
#include "kernels/cuda/attention_tc_fwd.cuh"
#include "kernels/cuda/attention_tc_traits.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/cuda_emulation/warp_runtime.h"

namespace packsched::kernels::internal::cuda {
namespace {

namespace emu = ::packsched_cuda_emulation;
using testing::AttentionTensors;
using testing::ExpectWithinTolerance;
using testing::Inputs;
using testing::MakeProblem;
using testing::Outputs;
using testing::Problem;
using testing::RandomInputs;
using testing::RoundTo;

// A tree-packed layout: per packed row its subtree end and position (docs/design.md "Tree
// packing"), for the pieces of a Problem whose q and k segments are the pieces.
struct Tree {
  std::vector<int32_t> subtree_end, positions;
};

template <typename T, int kD>
void RunKernels(const TcAttnParams& p) {
  using Fwd = TcTraits<kD, TcKernel::kForward>;
  using Dq = TcTraits<kD, TcKernel::kBackwardDq>;
  using DkDv = TcTraits<kD, TcKernel::kBackwardDkDv>;
  const AttentionArgs& a = p.args;
  dim3 grid;
  ASSERT_TRUE(TcGrid(a, a.max_seqlen_q, Fwd::kBr, a.heads, false, &grid));
  emu::RunGrid(grid, Fwd::kThreads, Fwd::kSharedBytes, [&] { AttentionTcForwardKernel<T, kD>(p); });
  ASSERT_TRUE(TcGrid(a, a.max_seqlen_q, Dq::kBr, a.heads, false, &grid));
  emu::RunGrid(grid, Dq::kThreads, Dq::kSharedBytes,
               [&] { AttentionTcBackwardDqKernel<T, kD>(p); });
  ASSERT_TRUE(TcGrid(a, a.max_seqlen_k, DkDv::kBc, a.kv_heads, true, &grid));
  emu::RunGrid(grid, DkDv::kThreads, DkDv::kSharedBytes,
               [&] { AttentionTcBackwardDkDvKernel<T, kD>(p); });
}

template <typename T>
FloatType TypeOf();
template <>
FloatType TypeOf<Fp16>() {
  return FloatType::kF16;
}
template <>
FloatType TypeOf<Bf16>() {
  return FloatType::kBf16;
}

// The naive attention of attention_reference.h with the tree predicate in place of the varlen
// rule: query i sees key j of its piece iff j <= i, i < subtree_end[j] and (with a left window w)
// positions[i] - positions[j] <= w. Gradients included; `round` as in NaiveAttention.
template <typename R>
Outputs TreeAttention(const Problem& p, const Inputs& in, const Tree& tree,
                      const std::function<double(double)>& round) {
  const std::vector<int32_t> cu = p.CuQ();
  const int64_t H = p.heads, Hk = p.kv_heads, D = p.head_dim, tq = p.RowsQ();
  const R scale = static_cast<R>(p.Scale());
  const int64_t w = p.WindowLeft();
  Outputs r;
  r.out.assign(tq * H * D, 0.0);
  r.lse.assign(H * tq, std::numeric_limits<double>::infinity());
  r.dq.assign(tq * H * D, 0.0);
  r.dk.assign(tq * Hk * D, 0.0);
  r.dv.assign(tq * Hk * D, 0.0);
  std::vector<R> dk(tq * Hk * D, 0), dv(tq * Hk * D, 0);
  for (int64_t b = 0; b < p.batch(); ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hk);
      for (int64_t i = cu[b]; i < cu[b] + p.len_q[b]; ++i) {
        std::vector<int64_t> keys;
        for (int64_t j = cu[b]; j <= i; ++j) {
          if (i >= tree.subtree_end[j]) continue;
          if (w >= 0 && tree.positions[i] - tree.positions[j] > w) continue;
          keys.push_back(j);
        }
        const int64_t qi = (i * H + h) * D;
        auto kv = [&](int64_t j) { return (j * Hk + hk) * D; };
        std::vector<R> s(keys.size());
        R m = -std::numeric_limits<R>::infinity();
        for (size_t n = 0; n < keys.size(); ++n) {
          R dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += static_cast<R>(in.q[qi + d]) * static_cast<R>(in.k[kv(keys[n]) + d]);
          }
          s[n] = dot * scale;
          m = std::max(m, s[n]);
        }
        if (keys.empty()) continue;
        R l = 0;
        for (R x : s) l += std::exp(x - m);
        r.lse[h * tq + i] = static_cast<double>(m + std::log(l));
        std::vector<R> P(keys.size()), dp(keys.size(), 0), out(D, 0), dq(D, 0);
        for (size_t n = 0; n < keys.size(); ++n) {
          P[n] = static_cast<R>(round(static_cast<double>(std::exp(s[n] - m) / l)));
          for (int64_t d = 0; d < D; ++d) out[d] += P[n] * static_cast<R>(in.v[kv(keys[n]) + d]);
        }
        for (int64_t d = 0; d < D; ++d) r.out[qi + d] = round(static_cast<double>(out[d]));
        R d_row = 0;
        for (size_t n = 0; n < keys.size(); ++n) {
          for (int64_t d = 0; d < D; ++d) {
            dp[n] += static_cast<R>(in.dout[qi + d]) * static_cast<R>(in.v[kv(keys[n]) + d]);
          }
          d_row += P[n] * dp[n];
        }
        for (size_t n = 0; n < keys.size(); ++n) {
          const R ds = P[n] * (dp[n] - d_row) * scale;
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += ds * static_cast<R>(in.k[kv(keys[n]) + d]);
            dk[kv(keys[n]) + d] += ds * static_cast<R>(in.q[qi + d]);
            dv[kv(keys[n]) + d] += P[n] * static_cast<R>(in.dout[qi + d]);
          }
        }
        for (int64_t d = 0; d < D; ++d) r.dq[qi + d] = round(static_cast<double>(dq[d]));
      }
    }
  }
  for (size_t i = 0; i < dk.size(); ++i) {
    r.dk[i] = round(static_cast<double>(dk[i]));
    r.dv[i] = round(static_cast<double>(dv[i]));
  }
  return r;
}

// Runs the three kernels on `p` (with `tree` when given) and checks out, lse, dq, dk and dv.
template <typename T>
void CheckTc(const Problem& p, const Tree* tree = nullptr, uint32_t seed = 1) {
  const Inputs in = RandomInputs<T>(p, seed);
  AttentionTensors<T> t(p, in);
  TcAttnParams params;
  AttentionArgs& a = params.args;
  a = AttentionArgs{};
  a.dtype = TypeOf<T>();
  a.q = t.q.view().data;
  a.k = t.k.view().data;
  a.v = t.v.view().data;
  a.cu_q = a.cu_q_host = t.cu_q_values.data();
  a.cu_k = a.cu_k_host = t.cu_k_values.data();
  a.seqused_q = p.padded() ? t.seqused_q.template data<int32_t>() : nullptr;
  a.seqused_k = p.padded() ? t.seqused_k.template data<int32_t>() : nullptr;
  a.batch = p.batch();
  a.total_q = p.RowsQ();
  a.total_k = p.RowsK();
  a.heads = p.heads;
  a.kv_heads = p.kv_heads;
  a.head_dim = p.head_dim;
  a.max_seqlen_q = t.seqlens.max_seqlen_q;
  for (size_t b = 0; b + 1 < t.cu_k_values.size(); ++b) {
    a.max_seqlen_k = std::max<int64_t>(a.max_seqlen_k, t.cu_k_values[b + 1] - t.cu_k_values[b]);
  }
  a.scale = p.Scale();
  a.softcap = p.options.softcap;
  a.causal = p.options.causal;
  a.window_left = p.WindowLeft();
  a.window_right = p.WindowRight();
  a.num_threads = 1;
  a.out = t.out.view().data;
  a.lse = t.lse.view().data;
  a.dout = t.dout.view().data;
  a.dq = t.dq.view().data;
  a.dk = t.dk.view().data;
  a.dv = t.dv.view().data;
  a.tree_window_left = -1;
  if (tree != nullptr) {
    // As the front end passes a tree (attention_api.cc): the left window on the positions.
    params.subtree_end = a.subtree_end = tree->subtree_end.data();
    params.positions = a.positions = tree->positions.data();
    a.tree_window_left = a.window_left;
    a.window_left = -1;
  }
  const uint64_t conflicts = emu::ldmatrix_bank_conflicts;
  const uint64_t phases = emu::ldmatrix_phases;
  if (p.head_dim == 64) {
    RunKernels<T, 64>(params);
  } else {
    ASSERT_EQ(p.head_dim, 128);
    RunKernels<T, 128>(params);
  }
  EXPECT_EQ(emu::ldmatrix_bank_conflicts - conflicts, 0u)
      << "of " << emu::ldmatrix_phases - phases << " ldmatrix phases";
  const Outputs got = t.Results();
  Outputs ref, naive;
  if (tree == nullptr) {
    ref = testing::NaiveAttention<double>(p, in, [](double x) { return x; });
    naive = testing::NaiveAttention<float>(p, in, RoundTo<T>);
  } else {
    ref = TreeAttention<double>(p, in, *tree, [](double x) { return x; });
    naive = TreeAttention<float>(p, in, *tree, RoundTo<T>);
  }
  ExpectWithinTolerance(got.out, naive.out, ref.out, 2, "out");
  ExpectWithinTolerance(got.lse, naive.lse, ref.lse, 2, "lse");
  ExpectWithinTolerance(got.dq, naive.dq, ref.dq, 3, "dq");
  ExpectWithinTolerance(got.dk, naive.dk, ref.dk, 3, "dk");
  ExpectWithinTolerance(got.dv, naive.dv, ref.dv, 3, "dv");
}

TEST(AttentionTcEmulatedTest, CausalGqaThreeSequencesD64) {
  Problem p = MakeProblem({100, 37, 119}, {100, 37, 119}, true);
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  CheckTc<Bf16>(p);
}

TEST(AttentionTcEmulatedTest, BottomRightCausalUnequalLengthsD128) {
  Problem p = MakeProblem({70, 130}, {133, 40}, true);
  p.head_dim = 128;
  CheckTc<Bf16>(p);
}

// The kit's configuration in small: bf16, D = 128, groups of 4 query heads per kv head, causal.
TEST(AttentionTcEmulatedTest, KitShapeGqaGroupOfFourD128) {
  Problem p = MakeProblem({150, 70, 36}, {150, 70, 36}, true);
  p.heads = 4;
  p.kv_heads = 1;
  p.head_dim = 128;
  CheckTc<Bf16>(p);
}

TEST(AttentionTcEmulatedTest, WindowWithoutCausalD128Fp16) {
  Problem p = MakeProblem({70, 33}, {33, 130}, false);
  p.head_dim = 128;
  p.options.window_left = 16;
  p.options.window_right = 4;
  CheckTc<Fp16>(p);
}

TEST(AttentionTcEmulatedTest, PaddedLayoutMqaCausalWindowSoftcapAndTailD64) {
  Problem p = MakeProblem({97, 0, 40}, {60, 13, 75}, true);
  p.heads = 3;
  p.kv_heads = 1;
  p.head_dim = 64;
  p.pad_q = {3, 8, 0};
  p.pad_k = {4, 3, 5};
  p.tail_q = 20;
  p.tail_k = 7;
  p.options.window_left = 30;
  p.options.softcap = 3.0;
  CheckTc<Bf16>(p);
}

TEST(AttentionTcEmulatedTest, OnlyTailRows) {
  Problem p = MakeProblem({}, {});
  p.head_dim = 64;
  p.tail_q = 70;
  p.tail_k = 5;
  CheckTc<Fp16>(p);
}

// Appends one piece (a forest of nodes with lengths `len` and parents `parent`, parents before
// children) to `tree` in depth-first preorder (children in ascending index), with each row's
// subtree end and position as "Tree packing" defines them; returns the piece's rows.
int32_t AppendPiece(const std::vector<int32_t>& len, const std::vector<int32_t>& parent,
                    Tree* tree) {
  std::vector<std::vector<int32_t>> children(len.size());
  std::vector<int32_t> roots;
  for (size_t n = 0; n < len.size(); ++n) {
    (parent[n] < 0 ? roots : children[parent[n]]).push_back(static_cast<int32_t>(n));
  }
  const int32_t row0 = static_cast<int32_t>(tree->subtree_end.size());
  int32_t rows = 0;
  for (int32_t l : len) rows += l;
  tree->subtree_end.resize(row0 + rows);
  tree->positions.resize(row0 + rows);
  int32_t next = row0;
  std::function<void(int32_t, int32_t)> visit = [&](int32_t n, int32_t depth) {
    const int32_t start = next;
    next += len[n];
    for (int32_t c : children[n]) visit(c, depth + len[n]);
    for (int32_t r = 0; r < len[n]; ++r) {
      tree->subtree_end[start + r] = next;
      tree->positions[start + r] = depth + r;
    }
  };
  for (int32_t root : roots) visit(root, 0);
  return rows;
}

// A random forest per piece of `piece_rows` rows: nodes of 1 to 40 tokens, each node's parent a
// random earlier node or none. Sets *p to the pieces as causal self-attention sequences.
Tree RandomForest(const std::vector<int32_t>& piece_rows, Problem* p, uint32_t seed) {
  std::mt19937 rng(seed);
  Tree tree;
  for (int32_t rows : piece_rows) {
    std::vector<int32_t> len, parent;
    for (int32_t left = rows; left > 0;) {
      const int32_t l = std::min<int32_t>(left, std::uniform_int_distribution<int32_t>(1, 40)(rng));
      parent.push_back(len.empty() ? -1
                                   : std::uniform_int_distribution<int32_t>(
                                         -1, static_cast<int32_t>(len.size()) - 1)(rng));
      len.push_back(l);
      left -= l;
    }
    AppendPiece(len, parent, &tree);
  }
  *p = MakeProblem(piece_rows, piece_rows, true);
  return tree;
}

TEST(AttentionTcEmulatedTest, TreeMaskD64) {
  Problem p;
  const Tree tree = RandomForest({150, 90}, &p, 5);
  p.heads = 2;
  p.kv_heads = 1;
  p.head_dim = 64;
  CheckTc<Bf16>(p, &tree);
}

TEST(AttentionTcEmulatedTest, TreeMaskWithPositionWindowD128) {
  Problem p;
  const Tree tree = RandomForest({200}, &p, 9);
  p.head_dim = 128;
  p.options.window_left = 24;
  CheckTc<Fp16>(p, &tree);
}

// A prompt of 16 tokens with two answers of 120: the second answer's query tiles skip the first
// answer's key tiles (every key's subtree ends before them), so the tree run issues fewer mma
// tiles than plain causal attention over the same rows, and both match their references.
TEST(AttentionTcEmulatedTest, TreeSkipsKeyTilesNoQuerySees) {
  Tree tree;
  const int32_t rows = AppendPiece({16, 120, 120}, {-1, 0, 0}, &tree);
  Problem p = MakeProblem({rows}, {rows}, true);
  p.heads = 1;
  p.head_dim = 64;
  uint64_t mma = emu::mma_calls;
  CheckTc<Bf16>(p, &tree);
  const uint64_t with_tree = emu::mma_calls - mma;
  mma = emu::mma_calls;
  CheckTc<Bf16>(p);
  const uint64_t causal = emu::mma_calls - mma;
  EXPECT_LT(with_tree, causal);
}

}  // namespace
}  // namespace packsched::kernels::internal::cuda
