// The tensor-core attention kernels (kernels/cuda/attention_tc_fwd.cuh, attention_tc_bwd.cuh,
// attention_tc_bwd_keys.cuh) run on the CPU under the warp-accurate emulation
// (cuda_emulation/warp_runtime.h and its ptx.cuh), over the launchers' grids, against the float64
// reference with the tolerance rule of docs/design.md §4: every mask mode of the varlen API,
// GQA/MQA, seqused, the tail, and the tree rule of "Tree packing" (the reference's tree
// predicate), at head dims 64, 96 and 128, at 128 with both forward tiles (128 and 64 query
// rows). Also checks that no ldmatrix phase of the kernels hits a shared-memory bank conflict. The
// one-pass backward (attention_tc_bwd_onepass.cuh) runs the same modes at head dims 64 and 128
// (96 in some). And every kernel gives bitwise the same results whichever order the emulation
// resumes a block's threads in (its racecheck). With a query-row map (tree CP's head-tail rows)
// the kernels and the blank-rows kernel give the mapped rows bitwise what the run without the map
// gives them, and agree with the CPU backend's map.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_runtime.h"  // the emulation (this target's include path puts it first)
#include "gtest/gtest.h"
#include "kernels/cuda/attention_tc_bwd.cuh"
#include "kernels/cuda/attention_tc_bwd_keys.cuh"
#include "kernels/cuda/attention_tc_bwd_onepass.cuh"
#include "kernels/cuda/attention_tc_fwd.cuh"
#include "kernels/cuda/attention_tc_traits.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/cuda_emulation/warp_runtime.h"
#include "tests/kernels/emulated_attention_args.h"
#include "tests/kernels/emulated_query_rows.h"

namespace packsched::kernels::internal::cuda {
namespace {

namespace emu = ::packsched_cuda_emulation;
using testing::AttentionTensors;
using testing::HostTensor;
using testing::Inputs;
using testing::MakeProblem;
using testing::Problem;
using testing::RandomInputs;

// A tree-packed layout: per packed row its subtree end and position (docs/design.md "Tree
// packing"), for the pieces of a Problem whose q and k segments are the pieces.
struct Tree {
  std::vector<int32_t> subtree_end, positions;
};

// The forward with kM 16-row mma tiles per warp over the launcher's grid (walked heaviest-first
// by the kernel itself).
template <typename T, int kD, int kM>
void RunForward(const TcAttnParams& p) {
  using Fwd = TcTraits<kD, TcKernel::kForward, kM>;
  const AttentionArgs& a = p.args;
  dim3 grid;
  ASSERT_TRUE(TcGrid(a, a.max_seqlen_q, Fwd::kBr, a.heads, false, &grid));
  emu::RunGrid(grid, Fwd::kThreads, Fwd::kSharedBytes,
               [&] { AttentionTcForwardKernel<T, kD, kM>(p); });
}

// The backward's pre-pass over the launcher's grid: returns D [total_q, heads] (a buffer filled
// with NaN first, so that a row the kernel misses shows up) after checking every real row's D
// (inside a sequence's seqused rows; the others, pads and tail, are never read) against dO · O in
// float64.
template <typename T, int kD>
std::vector<float> RunDotOut(const Problem& pb, const AttentionArgs& a) {
  const int64_t rows = a.total_q * a.heads;
  std::vector<float> d(static_cast<size_t>(rows), std::numeric_limits<float>::quiet_NaN());
  const int64_t blocks = DotOutBlocks(rows, kD);
  if (blocks > 0) {
    emu::RunGrid(dim3(static_cast<unsigned>(blocks)), kDotOutThreads, 0,
                 [&] { AttentionTcDotOutKernel<T, kD>(a.out, a.dout, d.data(), rows); });
  }
  const T* out = static_cast<const T*>(a.out);
  const T* dout = static_cast<const T*>(a.dout);
  const std::vector<int32_t> cu = pb.CuQ();
  for (size_t b = 0; b < pb.len_q.size(); ++b) {
    for (int64_t row = cu[b]; row < cu[b] + pb.len_q[b]; ++row) {
      for (int64_t h = 0; h < a.heads; ++h) {
        const int64_t r = row * a.heads + h;
        double want = 0, scale = 0;
        for (int c = 0; c < kD; ++c) {
          const double x = static_cast<double>(ToAcc(dout[r * kD + c])) * ToAcc(out[r * kD + c]);
          want += x;
          scale += std::abs(x);
        }
        EXPECT_NEAR(d[r], want, 1e-5 * scale + 1e-30) << "row " << row << " head " << h;
      }
    }
  }
  return d;
}

// The mma instructions each backward pass has issued so far (RunBackward), for the tests of the
// passes' tile skips.
uint64_t pass1_mma_calls = 0;
uint64_t pass2_mma_calls = 0;

// The deterministic backward over the launchers' grids: the pre-pass, pass 1, pass 2.
template <typename T, int kD>
void RunBackward(const Problem& pb, TcAttnParams p) {
  using Dq = TcTraits<kD, TcKernel::kBackwardDq>;
  using DkDv = TcTraits<kD, TcKernel::kBackwardDkDv>;
  const AttentionArgs& a = p.args;
  const std::vector<float> d = RunDotOut<T, kD>(pb, a);
  p.dout_dot_out = d.data();
  dim3 grid;
  ASSERT_TRUE(TcGrid(a, a.max_seqlen_q, Dq::kBr, a.heads, false, &grid));
  uint64_t before = emu::mma_calls;
  emu::RunGrid(grid, Dq::kThreads, Dq::kSharedBytes,
               [&] { AttentionTcBackwardDqKernel<T, kD>(p); });
  pass1_mma_calls += emu::mma_calls - before;
  ASSERT_TRUE(TcGrid(a, a.max_seqlen_k, DkDv::kBc, a.kv_heads, true, &grid));
  before = emu::mma_calls;
  emu::RunGrid(grid, DkDv::kThreads, DkDv::kSharedBytes, [&] {
    if (p.args.query_runs != nullptr) {
      AttentionTcBackwardDkDvKernel<T, kD, true>(p);
    } else {
      AttentionTcBackwardDkDvKernel<T, kD, false>(p);
    }
  });
  pass2_mma_calls += emu::mma_calls - before;
}

template <typename T>
TcAttnParams ParamsOf(const Problem& p, AttentionTensors<T>& t) {
  TcAttnParams params;
  params.args = testing::EmulatedArgs(p, t);
  params.subtree_end = params.args.subtree_end;
  params.positions = params.args.positions;
  return params;
}

bool SameBits(const std::vector<double>& x, const std::vector<double>& y) {
  return x.size() == y.size() &&
         (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
}

// WithTcHeadDim for a problem's head dim, which must have tensor-core kernels.
template <typename F>
void WithHeadDim(int64_t d, F&& f) {
  ASSERT_TRUE(TcHeadDim(static_cast<int>(d))) << d;
  WithTcHeadDim(d, std::forward<F>(f));
}

// Runs the kernels on `p` (with `tree` when given) and checks out, lse, dq, dk and dv: the
// forward with 128-row query tiles (the launcher's default), and at D = 128 also the forward
// with 64-row tiles (PACKSCHED_ATTENTION_TC_FWD_TILE=64) on fresh output tensors. With
// `deterministic_check`, also runs the backward a second time and requires bitwise equal
// gradients. `adjust`, when given, changes the random inputs first (keeping them representable
// in T).
template <typename T>
void CheckTc(Problem p, const Tree* tree = nullptr, uint32_t seed = 1,
             bool deterministic_check = false,
             const std::function<void(const Problem&, Inputs*)>& adjust = {}) {
  if (tree != nullptr) {
    p.subtree_end = tree->subtree_end;
    p.positions = tree->positions;
  }
  Inputs in = RandomInputs<T>(p, seed);
  if (adjust) adjust(p, &in);
  AttentionTensors<T> t(p, in);
  const TcAttnParams params = ParamsOf(p, t);
  const uint64_t conflicts = emu::ldmatrix_bank_conflicts;
  const uint64_t phases = emu::ldmatrix_phases;
  WithHeadDim(p.head_dim, [&](auto dim) {
    RunForward<T, decltype(dim)::value, 2>(params);
    RunBackward<T, decltype(dim)::value>(p, params);
  });
  const testing::Outputs got = t.Results();
  testing::ExpectMatchesReference<T>(p, in, got);
  if (deterministic_check) {
    // The backward again over gradients overwritten with NaN (all bits set, in fp16 and bf16):
    // bitwise the same dq, dk and dv.
    for (HostTensor* g : {&t.dq, &t.dk, &t.dv}) {
      std::memset(g->mutable_view().data, 0xff, static_cast<size_t>(g->nbytes()));
    }
    WithHeadDim(p.head_dim, [&](auto dim) { RunBackward<T, decltype(dim)::value>(p, params); });
    const testing::Outputs again = t.Results();
    EXPECT_TRUE(SameBits(got.dq, again.dq)) << "dq differs between two runs";
    EXPECT_TRUE(SameBits(got.dk, again.dk)) << "dk differs between two runs";
    EXPECT_TRUE(SameBits(got.dv, again.dv)) << "dv differs between two runs";
  }
  if (p.head_dim == 128) {
    AttentionTensors<T> t64(p, in);
    RunForward<T, 128, 1>(ParamsOf(p, t64));
    testing::Outputs got64 = t64.Results();
    got64.dq = got.dq;  // the backward ran once, above
    got64.dk = got.dk;
    got64.dv = got.dv;
    testing::ExpectMatchesReference<T>(p, in, got64, "64-row forward tiles: ");
  }
  EXPECT_EQ(emu::ldmatrix_bank_conflicts - conflicts, 0u)
      << "of " << emu::ldmatrix_phases - phases << " ldmatrix phases";
}

// Three causal sequences of 100, 37 and 119 rows, groups of 2 query heads per kv head.
Problem CausalGqaThreeSequences(int64_t head_dim) {
  Problem p = MakeProblem({100, 37, 119}, {100, 37, 119}, true);
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = head_dim;
  return p;
}

TEST(AttentionTcEmulatedTest, CausalGqaThreeSequencesD64AndDeterministic) {
  CheckTc<Bf16>(CausalGqaThreeSequences(64), nullptr, 1, /*deterministic_check=*/true);
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

// Keys whose scale rises along each sequence (RisingKeys): each row's largest score grows by more
// than the forward's rescale slack (kRescaleSlack) from key tile to key tile, so O is rescaled
// after it has accumulated (random inputs alone rescale on a row's first keys only).
TEST(AttentionTcEmulatedTest, RisingScoresRescaleTheAccumulatedOutput) {
  for (const int64_t head_dim : {64, 96, 128}) {
    Problem p = MakeProblem({200, 90}, {200, 90}, true);
    p.head_dim = head_dim;
    CheckTc<Bf16>(p, nullptr, 3, false, testing::RisingKeys<Bf16>);
  }
}

TEST(AttentionTcEmulatedTest, WindowWithoutCausalD128Fp16) {
  Problem p = MakeProblem({70, 33}, {33, 130}, false);
  p.head_dim = 128;
  p.options.window_left = 16;
  p.options.window_right = 4;
  CheckTc<Fp16>(p);
}

// MQA over a padded layout (seqused), causal with a left window, softcap and tail rows.
Problem PaddedMqaProblem(int64_t head_dim) {
  Problem p = MakeProblem({97, 0, 40}, {60, 13, 75}, true);
  p.heads = 3;
  p.kv_heads = 1;
  p.head_dim = head_dim;
  p.pad_q = {3, 8, 0};
  p.pad_k = {4, 3, 5};
  p.tail_q = 20;
  p.tail_k = 7;
  p.options.window_left = 30;
  p.options.softcap = 3.0;
  return p;
}

TEST(AttentionTcEmulatedTest, PaddedLayoutMqaCausalWindowSoftcapAndTailD64) {
  CheckTc<Bf16>(PaddedMqaProblem(64));
}

TEST(AttentionTcEmulatedTest, PaddedLayoutMqaCausalWindowSoftcapAndTailD128AndDeterministic) {
  CheckTc<Bf16>(PaddedMqaProblem(128), nullptr, 1, /*deterministic_check=*/true);
}

// Head dim 96: rows of 12 chunks, swizzled within groups of 4 (SwzChunk) and copied in parts of
// 8 and 4 chunks; the bank-conflict count of CheckTc covers the swizzle.
TEST(AttentionTcEmulatedTest, CausalGqaThreeSequencesD96AndDeterministic) {
  CheckTc<Bf16>(CausalGqaThreeSequences(96), nullptr, 1, /*deterministic_check=*/true);
}

TEST(AttentionTcEmulatedTest, PaddedLayoutMqaCausalWindowSoftcapAndTailD96Fp16) {
  CheckTc<Fp16>(PaddedMqaProblem(96));
}

// Sequences of 1 to 3 query tiles of 128 rows (and 1 to 5 of 64) beside a short one, so that the
// heaviest-first walk of the grid skips the blocks past each sequence's tiles and reaches the
// tail; bottom-right causal with more keys than queries.
TEST(AttentionTcEmulatedTest, HeaviestFirstOverTilesOfUnequalSequencesD128Fp16) {
  Problem p = MakeProblem({260, 9, 129}, {270, 9, 140}, true);
  p.heads = 1;
  p.head_dim = 128;
  p.tail_q = 3;
  CheckTc<Fp16>(p);
}

// Pass 2 walks its grid heaviest first. Under a causal mask over sequences of 5, 2 and 4 key
// blocks (128 keys; lengths multiples of the 64-row query tiles, so that blocks as far from their
// sequence's end are seen by as many query tiles and issue as many products), the blocks in launch
// order (the emulation runs the grid's linear order, as the hardware roughly starts it) issue
// non-increasing numbers of mma instructions, the blocks past a sequence's end none. In the grid's
// plain order the second sequence's heaviest block would follow the first's lightest.
TEST(AttentionTcEmulatedTest, PassTwoStartsItsHeaviestBlocksFirst) {
  Problem p = MakeProblem({640, 256, 512}, {640, 256, 512}, true);
  p.heads = 1;
  p.kv_heads = 1;
  p.head_dim = 64;
  const Inputs in = RandomInputs<Bf16>(p, 4);
  AttentionTensors<Bf16> t(p, in);
  TcAttnParams params = ParamsOf(p, t);
  RunForward<Bf16, 64, 2>(params);
  const std::vector<float> d = RunDotOut<Bf16, 64>(p, params.args);
  params.dout_dot_out = d.data();
  using DkDv = TcTraits<64, TcKernel::kBackwardDkDv>;
  dim3 grid;
  ASSERT_TRUE(TcGrid(params.args, params.args.max_seqlen_k, DkDv::kBc, 1, true, &grid));
  emu::grid_dim = grid;        // as RunGrid sets it, block by block below
  std::vector<uint64_t> work;  // mma instructions of each block that issued any, in launch order
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        const uint64_t before = emu::mma_calls;
        emu::RunBlock(dim3(x, y, z), DkDv::kThreads, DkDv::kSharedBytes,
                      [&] { AttentionTcBackwardDkDvKernel<Bf16, 64, false>(params); });
        if (emu::mma_calls > before) work.push_back(emu::mma_calls - before);
      }
    }
  }
  ASSERT_EQ(work.size(), 5u + 2u + 4u);
  for (size_t i = 1; i < work.size(); ++i) {
    EXPECT_LE(work[i], work[i - 1]) << "block " << i << " of those that issued products";
  }
  EXPECT_GT(work.front(), work.back());
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

// A random forest over pieces of `piece_rows` rows, 2 query heads on one kv head, head dim d.
void CheckTreeMask(const std::vector<int32_t>& piece_rows, uint32_t seed, int64_t d) {
  Problem p;
  const Tree tree = RandomForest(piece_rows, &p, seed);
  p.heads = 2;
  p.kv_heads = 1;
  p.head_dim = d;
  CheckTc<Bf16>(p, &tree);
}

TEST(AttentionTcEmulatedTest, TreeMaskD64) { CheckTreeMask({150, 90}, 5, 64); }

TEST(AttentionTcEmulatedTest, TreeMaskD128) { CheckTreeMask({170}, 3, 128); }

TEST(AttentionTcEmulatedTest, TreeMaskD96) { CheckTreeMask({150, 90}, 7, 96); }

TEST(AttentionTcEmulatedTest, TreeMaskWithPositionWindowD128) {
  Problem p;
  const Tree tree = RandomForest({200}, &p, 9);
  p.head_dim = 128;
  p.options.window_left = 24;
  CheckTc<Fp16>(p, &tree);
}

// A prompt of 16 tokens with two answers of 120: the second answer's query tiles skip the first
// answer's key tiles (every key's subtree ends before them), so the tree run issues fewer mma
// tiles than plain causal attention over the same rows, in all and in each backward pass, and
// both match their references.
TEST(AttentionTcEmulatedTest, TreeSkipsKeyTilesNoQuerySees) {
  Tree tree;
  const int32_t rows = AppendPiece({16, 120, 120}, {-1, 0, 0}, &tree);
  Problem p = MakeProblem({rows}, {rows}, true);
  p.heads = 1;
  p.head_dim = 64;
  uint64_t mma = emu::mma_calls, pass1 = pass1_mma_calls, pass2 = pass2_mma_calls;
  CheckTc<Bf16>(p, &tree);
  const uint64_t with_tree = emu::mma_calls - mma;
  const uint64_t tree_pass1 = pass1_mma_calls - pass1, tree_pass2 = pass2_mma_calls - pass2;
  mma = emu::mma_calls, pass1 = pass1_mma_calls, pass2 = pass2_mma_calls;
  CheckTc<Bf16>(p);
  const uint64_t causal = emu::mma_calls - mma;
  EXPECT_LT(with_tree, causal);
  EXPECT_LT(tree_pass1, pass1_mma_calls - pass1);
  EXPECT_LT(tree_pass2, pass2_mma_calls - pass2);
}

// The one-pass backward (attention_tc_bwd_onepass.cuh) after the forward: the pre-pass, the
// kernel over pass 2's grid into a zeroed float32 accumulator, then DqFromAccumKernel over its
// grid (no barrier: its threads run one after another).
template <typename T, int kD>
void RunOnePassKernels(const Problem& pb, const TcAttnParams& p) {
  using One = TcOnePassTraits<kD>;
  const AttentionArgs& a = p.args;
  RunForward<T, kD, 2>(p);
  const std::vector<float> d = RunDotOut<T, kD>(pb, a);
  TcAttnParams with_d = p;
  with_d.dout_dot_out = d.data();
  dim3 grid;
  std::vector<float> acc(static_cast<size_t>(a.total_q * a.heads * kD), 0.f);
  ASSERT_TRUE(TcGrid(a, a.max_seqlen_k, One::kBc, a.kv_heads, true, &grid));
  emu::RunGrid(grid, One::kThreads, One::kSharedBytes,
               [&] { AttentionTcBackwardOnePassKernel<T, kD>(with_d, acc.data()); });
  const int64_t n4 = static_cast<int64_t>(acc.size()) / 4;
  for (int64_t b = 0; b * kDqConvertThreads < n4; ++b) {
    for (int t = 0; t < kDqConvertThreads; ++t) {
      emu::block_idx = dim3(static_cast<unsigned>(b));
      emu::thread_idx = dim3(t);
      DqFromAccumKernel<T>(acc.data(), static_cast<T*>(a.dq), n4, static_cast<float>(a.scale));
    }
  }
}

// CheckTc for the one-pass backward, at `head_dims` (of 64, 96 and 128); dq must have come
// through atomics whenever some query row sees a key.
template <typename T>
void CheckOnePass(Problem p, const Tree* tree = nullptr, uint32_t seed = 3,
                  std::initializer_list<int> head_dims = {64, 128}) {
  if (tree != nullptr) {
    p.subtree_end = tree->subtree_end;
    p.positions = tree->positions;
  }
  for (const int d : head_dims) {
    SCOPED_TRACE(d);
    p.head_dim = d;
    const Inputs in = RandomInputs<T>(p, seed);
    AttentionTensors<T> t(p, in);
    TcAttnParams params;
    params.args = testing::EmulatedArgs(p, t);
    params.subtree_end = params.args.subtree_end;
    params.positions = params.args.positions;
    const uint64_t conflicts = emu::ldmatrix_bank_conflicts;
    const uint64_t phases = emu::ldmatrix_phases;
    const uint64_t atomics = emu::atomic_adds;
    WithHeadDim(d, [&](auto dim) { RunOnePassKernels<T, decltype(dim)::value>(p, params); });
    EXPECT_EQ(emu::ldmatrix_bank_conflicts - conflicts, 0u)
        << "of " << emu::ldmatrix_phases - phases << " ldmatrix phases";
    if (p.batch() > 0) {
      EXPECT_GT(emu::atomic_adds - atomics, 0u);
    }
    testing::ExpectMatchesReference<T>(p, in, t.Results(), "one-pass ");
  }
}

TEST(AttentionTcOnePassEmulatedTest, CausalGqaThreeSequences) {
  CheckOnePass<Bf16>(CausalGqaThreeSequences(64), nullptr, 3, {64, 96, 128});
}

TEST(AttentionTcOnePassEmulatedTest, BottomRightCausalUnequalLengths) {
  CheckOnePass<Bf16>(MakeProblem({70, 130}, {133, 40}, true));
}

TEST(AttentionTcOnePassEmulatedTest, WindowWithoutCausalFp16) {
  Problem p = MakeProblem({70, 33}, {33, 130}, false);
  p.options.window_left = 16;
  p.options.window_right = 4;
  CheckOnePass<Fp16>(p);
}

TEST(AttentionTcOnePassEmulatedTest, PaddedLayoutMqaCausalWindowSoftcapAndTail) {
  CheckOnePass<Bf16>(PaddedMqaProblem(64));
}

TEST(AttentionTcOnePassEmulatedTest, OnlyTailRows) {
  Problem p = MakeProblem({}, {});
  p.tail_q = 70;
  p.tail_k = 5;
  CheckOnePass<Fp16>(p);
}

TEST(AttentionTcOnePassEmulatedTest, TreeMask) {
  Problem p;
  const Tree tree = RandomForest({150, 90}, &p, 5);
  p.heads = 2;
  p.kv_heads = 1;
  CheckOnePass<Bf16>(p, &tree, 3, {64, 96, 128});
}

TEST(AttentionTcOnePassEmulatedTest, TreeMaskWithPositionWindowFp16) {
  Problem p;
  const Tree tree = RandomForest({200}, &p, 9);
  p.options.window_left = 24;
  CheckOnePass<Fp16>(p, &tree);
}

// Random problems: each seed draws a head dim (64, 96, 128), a dtype, and either a tree-packed
// forest of 1 to 3 pieces or 1 to 3 sequences of 0 to 200 query and key rows (equal or not),
// causal or not, each of a left window, a right window, a softcap, pad slots and a tail with
// probability 1/3, and 1 or 2 kv heads with groups of 1 to 3 query heads; the kernels (CheckTc:
// both forwards at D 128, the two-pass backward) and the one-pass backward must match the
// reference, run in a random one of the emulation's thread orders. PACKSCHED_TC_FUZZ_CASES sets
// the number of seeds (default 6, a few seconds); PACKSCHED_TC_FUZZ_SEED the first.
int64_t EnvOr(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : fallback;
}

template <typename T>
void CheckOnePassAt(const Problem& p, uint32_t seed) {
  const Inputs in = RandomInputs<T>(p, seed);
  AttentionTensors<T> t(p, in);
  const TcAttnParams params = ParamsOf(p, t);
  WithHeadDim(p.head_dim, [&](auto dim) { RunOnePassKernels<T, decltype(dim)::value>(p, params); });
  testing::ExpectMatchesReference<T>(p, in, t.Results(), "one-pass ");
}

TEST(AttentionTcFuzzTest, RandomProblemsMatchTheReference) {
  const int64_t cases = EnvOr("PACKSCHED_TC_FUZZ_CASES", 6);
  const auto first = static_cast<uint32_t>(EnvOr("PACKSCHED_TC_FUZZ_SEED", 1));
  for (uint32_t seed = first; seed < first + cases; ++seed) {
    std::mt19937 rng(seed);
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    auto one_in_3 = [&] { return uniform(0, 2) == 0; };
    Problem p;
    Tree tree;
    const bool is_tree = uniform(0, 3) == 0;
    if (is_tree) {
      std::vector<int32_t> pieces(static_cast<size_t>(uniform(1, 3)));
      for (int32_t& rows : pieces) rows = uniform(1, 200);
      tree = RandomForest(pieces, &p, seed);
      p.subtree_end = tree.subtree_end;
      p.positions = tree.positions;
    } else {
      const int batch = uniform(1, 3);
      const bool same = uniform(0, 1) == 0;
      for (int b = 0; b < batch; ++b) {
        p.len_q.push_back(uniform(0, 200));
        p.len_k.push_back(same ? p.len_q.back() : uniform(0, 200));
      }
      p.options.causal = uniform(0, 1) == 0;
      if (one_in_3()) p.options.window_right = uniform(0, 40);
      if (one_in_3()) {
        for (int b = 0; b < batch; ++b) {
          p.pad_q.push_back(uniform(0, 9));
          p.pad_k.push_back(uniform(0, 9));
        }
      }
      if (one_in_3()) {
        p.tail_q = uniform(1, 40);
        p.tail_k = uniform(0, 9);
      }
    }
    if (one_in_3()) p.options.window_left = uniform(0, 80);
    if (one_in_3()) p.options.softcap = uniform(2, 10);
    p.kv_heads = uniform(1, 2);
    p.heads = p.kv_heads * uniform(1, 3);
    const int dims[] = {64, 96, 128};
    p.head_dim = dims[uniform(0, 2)];
    const bool fp16 = uniform(0, 1) == 0;
    std::ostringstream what;
    what << "seed " << seed << (fp16 ? " fp16" : " bf16") << " D " << p.head_dim
         << (is_tree ? " tree" : "") << (p.options.causal ? " causal" : "") << " q";
    for (const int32_t l : p.len_q) what << " " << l;
    what << " k";
    for (const int32_t l : p.len_k) what << " " << l;
    what << " window " << p.options.window_left << "/" << p.options.window_right << " softcap "
         << p.options.softcap << " heads " << p.heads << "/" << p.kv_heads
         << (p.padded() ? " padded" : "") << " tail " << p.tail_q << "/" << p.tail_k;
    const emu::Schedule order{static_cast<emu::ThreadOrder>(uniform(0, 3)), seed};
    what << " thread order " << static_cast<int>(order.order);
    SCOPED_TRACE(what.str());
    const emu::Schedule saved = emu::schedule;
    emu::schedule = order;
    if (fp16) {
      CheckTc<Fp16>(p, nullptr, seed);
      CheckOnePassAt<Fp16>(p, seed);
    } else {
      CheckTc<Bf16>(p, nullptr, seed);
      CheckOnePassAt<Bf16>(p, seed);
    }
    emu::schedule = saved;
  }
}

// Every tensor-core kernel's results on p under the scheduler order `order` (warp_runtime.h): the
// forward at both tiles (the 64-row tiles at D = 128 only), the two-pass backward and the one-pass
// backward, each on fresh tensors.
struct EveryKernel {
  testing::Outputs two_pass, forward64, one_pass;
};

template <typename T, int kD>
EveryKernel RunEveryKernel(const Problem& p, const Inputs& in, emu::Schedule order) {
  const emu::Schedule saved = emu::schedule;
  emu::schedule = order;
  EveryKernel r;
  AttentionTensors<T> t(p, in);
  const TcAttnParams params = ParamsOf(p, t);
  RunForward<T, kD, 2>(params);
  RunBackward<T, kD>(p, params);
  r.two_pass = t.Results();
  if constexpr (kD == 128) {
    AttentionTensors<T> t64(p, in);
    RunForward<T, 128, 1>(ParamsOf(p, t64));
    r.forward64 = t64.Results();
  }
  AttentionTensors<T> one(p, in);
  RunOnePassKernels<T, kD>(p, ParamsOf(p, one));
  r.one_pass = one.Results();
  emu::schedule = saved;
  return r;
}

// With `dq` false, dq is left out: the one-pass backward adds it up by atomics, in the order the
// blocks run.
void ExpectSameBits(const testing::Outputs& want, const testing::Outputs& got, const char* what,
                    bool dq = true) {
  EXPECT_TRUE(SameBits(want.out, got.out)) << what << " out";
  EXPECT_TRUE(SameBits(want.lse, got.lse)) << what << " lse";
  if (dq) {
    EXPECT_TRUE(SameBits(want.dq, got.dq)) << what << " dq";
  }
  EXPECT_TRUE(SameBits(want.dk, got.dk)) << what << " dk";
  EXPECT_TRUE(SameBits(want.dv, got.dv)) << what << " dv";
}

// The emulation's racecheck: the kernels give bitwise the same results whichever order the
// scheduler resumes a block's threads in between synchronisation points and runs the grid's
// blocks in (descending, shuffled on every sweep, and warp by warp), so no result rests on an
// access to shared memory that a barrier or a cp.async wait does not order (a buffer refilled while
// another warp reads it, a tile read before every warp has stored its part), nor on two blocks
// writing the same output. The one-pass backward's dq, added up by atomics in the order the blocks
// run, matches the reference under every order instead. The ascending run (the tests' default)
// matches it too.
template <typename T, int kD>
void CheckScheduleIndependent(Problem p, const Tree* tree = nullptr) {
  if (tree != nullptr) {
    p.subtree_end = tree->subtree_end;
    p.positions = tree->positions;
  }
  p.head_dim = kD;
  const Inputs in = RandomInputs<T>(p, 11);
  const EveryKernel want = RunEveryKernel<T, kD>(p, in, {emu::ThreadOrder::kAscending, 0});
  testing::ExpectMatchesReference<T>(p, in, want.two_pass);
  testing::ExpectMatchesReference<T>(p, in, want.one_pass, "one-pass ");
  for (const emu::Schedule order : {emu::Schedule{emu::ThreadOrder::kDescending, 0},
                                    emu::Schedule{emu::ThreadOrder::kShuffled, 1},
                                    emu::Schedule{emu::ThreadOrder::kWarpAhead, 1}}) {
    SCOPED_TRACE(static_cast<int>(order.order) * 100 + static_cast<int>(order.seed));
    const EveryKernel got = RunEveryKernel<T, kD>(p, in, order);
    ExpectSameBits(want.two_pass, got.two_pass, "two-pass");
    ExpectSameBits(want.forward64, got.forward64, "64-row forward");
    ExpectSameBits(want.one_pass, got.one_pass, "one-pass", /*dq=*/false);
    testing::ExpectMatchesReference<T>(p, in, got.one_pass, "one-pass ");
  }
}

TEST(AttentionTcScheduleTest, CausalGqaWithPartialTilesD128) {
  Problem p = MakeProblem({140, 36}, {140, 36}, true);
  p.heads = 2;
  p.kv_heads = 1;
  CheckScheduleIndependent<Bf16, 128>(p);
}

TEST(AttentionTcScheduleTest, PaddedLayoutMqaCausalWindowSoftcapAndTailD64) {
  CheckScheduleIndependent<Fp16, 64>(PaddedMqaProblem(64));
}

TEST(AttentionTcScheduleTest, WindowWithoutCausalD96) {
  Problem p = MakeProblem({70, 33}, {33, 130}, false);
  p.options.window_left = 16;
  p.options.window_right = 4;
  CheckScheduleIndependent<Bf16, 96>(p);
}

TEST(AttentionTcScheduleTest, TreeMaskD64) {
  Problem p;
  const Tree tree = RandomForest({150, 90}, &p, 5);
  p.heads = 2;
  p.kv_heads = 1;
  CheckScheduleIndependent<Bf16, 64>(p, &tree);
}

// The query-row map (attention_query_runs.cuh). The launchers' sequence with a map, on
// `params` (whose query_runs are set): the forward, the rows outside the map blanked (out 0, lse
// +inf), the two-pass backward, their dq blanked.
void RunBlankRows(const AttentionArgs& a, void* rows, float* lse) {
  emu::RunGrid(BlankRowsGrid(a), kBlankRowsThreads, 0,
               [&] { AttentionBlankRowsKernel<uint16_t>(a, rows, lse); });
}

// With `forward_map` false the forward runs without the map (every row's out and lse real), so
// that the backward must itself ignore the rows outside it.
template <typename T>
testing::Outputs RunMapped(const Problem& p, const Inputs& in, const std::vector<int32_t>& rows,
                           bool forward_map = true) {
  AttentionTensors<T> t(p, in);
  TcAttnParams params = ParamsOf(p, t);
  const testing::QueryRuns runs(rows);
  WithHeadDim(p.head_dim, [&](auto dim) {
    constexpr int kD = decltype(dim)::value;
    if (forward_map) runs.SetOn(params.args);
    RunForward<T, kD, 2>(params);
    RunBlankRows(params.args, params.args.out, static_cast<float*>(params.args.lse));
    runs.SetOn(params.args);
    RunBackward<T, kD>(p, params);
    RunBlankRows(params.args, params.args.dq, nullptr);
  });
  return t.Results();
}

// For each rank of a tree CP group of `cp` over p (its tree set): the rank's head-tail rows as
// the map; the kernels without it, on the inputs with dout 0 outside the map, against the
// reference; with it (on the unchanged inputs: the other rows' dout must not matter), the mapped
// rows bitwise the run without it and the others blank; the CPU backend with the map against
// both. The group's maps partition the rows.
template <typename T>
void CheckQueryRowMap(const Problem& p, int cp, uint32_t seed) {
  const Inputs in = RandomInputs<T>(p, seed);
  const int64_t tq = p.RowsQ();
  std::vector<int> holder(static_cast<size_t>(tq), 0);
  for (int rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE(::testing::Message() << "cp " << cp << " rank " << rank);
    const std::vector<int32_t> rows = testing::HeadTailRows(p.CuQ(), cp, rank, seed);
    const std::vector<bool> mapped = testing::MappedRows(rows, tq);
    for (const int32_t r : rows) ++holder[static_cast<size_t>(r)];
    const Inputs own = testing::WithDoutOnlyOn(p, in, mapped);
    AttentionTensors<T> all(p, own);
    const TcAttnParams params = ParamsOf(p, all);
    WithHeadDim(p.head_dim, [&](auto dim) {
      RunForward<T, decltype(dim)::value, 2>(params);
      RunBackward<T, decltype(dim)::value>(p, params);
    });
    const testing::Outputs want = all.Results();
    testing::ExpectMatchesReference<T>(p, own, want);
    const testing::Outputs got = RunMapped<T>(p, in, rows);
    testing::ExpectMappedRun(p, mapped, want, got, "tensor-core map");
    testing::ExpectCpuMapAgrees<T>(p, in, own, rows, mapped, want, got);
    // The backward reads nothing of the other rows: over the forward's out and lse without the
    // map, the same gradients (checked for the first rank).
    if (rank > 0) continue;
    const testing::Outputs over_all = RunMapped<T>(p, in, rows, /*forward_map=*/false);
    EXPECT_TRUE(SameBits(got.dq, over_all.dq)) << "dq over the forward without the map";
    EXPECT_TRUE(SameBits(got.dk, over_all.dk)) << "dk over the forward without the map";
    EXPECT_TRUE(SameBits(got.dv, over_all.dv)) << "dv over the forward without the map";
  }
  for (int64_t t = 0; t < tq; ++t) ASSERT_EQ(holder[static_cast<size_t>(t)], 1) << "row " << t;
}

// A random forest over pieces of `piece_rows` rows (multiples of 2 cp), `heads` query heads on
// `kv_heads`, head dim d.
Problem TreeCpProblem(const std::vector<int32_t>& piece_rows, uint32_t seed, int64_t heads,
                      int64_t kv_heads, int64_t d) {
  Problem p;
  const Tree tree = RandomForest(piece_rows, &p, seed);
  p.subtree_end = tree.subtree_end;
  p.positions = tree.positions;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = d;
  return p;
}

TEST(AttentionTcQueryRowsTest, TreeCpTwoRanksGqaD64) {
  CheckQueryRowMap<Bf16>(TreeCpProblem({136, 72}, 5, 4, 2, 64), 2, 21);
}

TEST(AttentionTcQueryRowsTest, TreeCpFourRanksD128Fp16) {
  CheckQueryRowMap<Fp16>(TreeCpProblem({136}, 3, 2, 1, 128), 4, 22);
}

TEST(AttentionTcQueryRowsTest, TreeCpTwoRanksPositionWindowAndSoftcapD96) {
  Problem p = TreeCpProblem({136, 64}, 7, 2, 1, 96);
  p.options.window_left = 24;
  p.options.softcap = 3.0;
  CheckQueryRowMap<Bf16>(p, 2, 23);
}

// Every rank's map empty but one's, which holds every row; and a map of one row.
TEST(AttentionTcQueryRowsTest, EmptyWholeAndSingleRowMaps) {
  const Problem p = TreeCpProblem({96, 40}, 9, 2, 1, 64);
  const Inputs in = RandomInputs<Bf16>(p, 4);
  const int64_t tq = p.RowsQ();
  std::vector<int32_t> every(static_cast<size_t>(tq));
  for (int64_t t = 0; t < tq; ++t) every[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  for (const std::vector<int32_t>& rows :
       {std::vector<int32_t>{}, every, std::vector<int32_t>{77}}) {
    SCOPED_TRACE(rows.size());
    const std::vector<bool> mapped = testing::MappedRows(rows, tq);
    const Inputs own = testing::WithDoutOnlyOn(p, in, mapped);
    AttentionTensors<Bf16> all(p, own);
    const TcAttnParams params = ParamsOf(p, all);
    RunForward<Bf16, 64, 2>(params);
    RunBackward<Bf16, 64>(p, params);
    const testing::Outputs want = all.Results();
    const testing::Outputs got = RunMapped<Bf16>(p, in, rows);
    testing::ExpectMappedRun(p, mapped, want, got, "tensor-core map");
    testing::ExpectCpuMapAgrees<Bf16>(p, in, own, rows, mapped, want, got);
  }
}

// A map computes only its rows: with rank 0's rows of a two-rank group over one long sequence
// (a head run and a tail run of 64 rows each, so that whole query tiles lie outside the map),
// the forward, pass 1 and pass 2 each issue fewer mma instructions than without the map.
TEST(AttentionTcQueryRowsTest, AMapSkipsTheTilesOutsideIt) {
  Problem p = MakeProblem({384}, {384}, true);
  p.head_dim = 64;
  const Inputs in = RandomInputs<Bf16>(p, 6);
  std::vector<int32_t> rows;
  for (int32_t r = 0; r < 384; ++r) {
    if (r < 64 || r >= 320) rows.push_back(r);
  }
  uint64_t mma[2][3];  // [mapped][forward, pass 1, pass 2]
  for (const bool with_map : {false, true}) {
    AttentionTensors<Bf16> t(p, in);
    TcAttnParams params = ParamsOf(p, t);
    const testing::QueryRuns runs(rows);
    if (with_map) runs.SetOn(params.args);
    const uint64_t before = emu::mma_calls;
    RunForward<Bf16, 64, 2>(params);
    mma[with_map][0] = emu::mma_calls - before;
    pass1_mma_calls = pass2_mma_calls = 0;
    RunBackward<Bf16, 64>(p, params);
    mma[with_map][1] = pass1_mma_calls;
    mma[with_map][2] = pass2_mma_calls;
  }
  for (int pass = 0; pass < 3; ++pass) {
    EXPECT_LT(mma[1][pass], mma[0][pass]) << "pass " << pass;
    EXPECT_GT(mma[1][pass], 0u) << "pass " << pass;
  }
}

// The racecheck of the mapped kernels: bitwise the same results under every scheduler order.
TEST(AttentionTcQueryRowsTest, ScheduleIndependentD64) {
  const Problem p = TreeCpProblem({152, 88}, 5, 2, 1, 64);
  const Inputs in = RandomInputs<Bf16>(p, 12);
  const std::vector<int32_t> rows = testing::HeadTailRows(p.CuQ(), 2, 1, 24);
  const emu::Schedule saved = emu::schedule;
  const testing::Outputs want = RunMapped<Bf16>(p, in, rows);
  for (const emu::Schedule order : {emu::Schedule{emu::ThreadOrder::kDescending, 0},
                                    emu::Schedule{emu::ThreadOrder::kShuffled, 1},
                                    emu::Schedule{emu::ThreadOrder::kWarpAhead, 1}}) {
    SCOPED_TRACE(static_cast<int>(order.order));
    emu::schedule = order;
    ExpectSameBits(want, RunMapped<Bf16>(p, in, rows), "mapped");
    emu::schedule = saved;
  }
}

// The opt-in limits of dynamic shared memory per block (CUDA programming guide, "Technical
// Specifications per Compute Capability"): 163 KiB on sm_80, 227 KiB on sm_90, 99 KiB on sm_86,
// sm_89 and sm_120.
constexpr size_t kOptinSm80 = 163 * 1024;
constexpr size_t kOptinSm90 = 227 * 1024;
constexpr size_t kOptinSm86 = 99 * 1024;

TEST(AttentionTcTraitsTest, EveryKernelFitsTheSharedMemoryTheLauncherChecks) {
  // Each kernel the launchers start asks for at most what AttentionTcApplies checks.
  EXPECT_LE((TcTraits<64, TcKernel::kForward>::kSharedBytes), TcMaxSharedBytes<64>());
  EXPECT_LE((TcTraits<64, TcKernel::kBackwardDq>::kSharedBytes), TcMaxSharedBytes<64>());
  EXPECT_LE((TcTraits<64, TcKernel::kBackwardDkDv>::kSharedBytes), TcMaxSharedBytes<64>());
  EXPECT_LE((TcOnePassTraits<64>::kSharedBytes), TcMaxSharedBytes<64>());
  EXPECT_LE((TcTraits<96, TcKernel::kForward>::kSharedBytes), TcMaxSharedBytes<96>());
  EXPECT_LE((TcTraits<96, TcKernel::kBackwardDq>::kSharedBytes), TcMaxSharedBytes<96>());
  EXPECT_LE((TcTraits<96, TcKernel::kBackwardDkDv>::kSharedBytes), TcMaxSharedBytes<96>());
  EXPECT_LE((TcOnePassTraits<96>::kSharedBytes), TcMaxSharedBytes<96>());
  EXPECT_LE((TcTraits<128, TcKernel::kForward>::kSharedBytes), TcMaxSharedBytes<128>());
  EXPECT_LE((TcTraits<128, TcKernel::kForward, 1>::kSharedBytes), TcMaxSharedBytes<128>());
  EXPECT_LE((TcTraits<128, TcKernel::kBackwardDq>::kSharedBytes), TcMaxSharedBytes<128>());
  EXPECT_LE((TcTraits<128, TcKernel::kBackwardDkDv>::kSharedBytes), TcMaxSharedBytes<128>());
  EXPECT_LE((TcOnePassTraits<128>::kSharedBytes), TcMaxSharedBytes<128>());
  // The machines the kit runs on take every head dim; the 99 KiB parts only head dim 64.
  for (const size_t optin : {kOptinSm80, kOptinSm90}) {
    EXPECT_TRUE(TcFitsSharedMemory(64, optin)) << optin;
    EXPECT_TRUE(TcFitsSharedMemory(96, optin)) << optin;
    EXPECT_TRUE(TcFitsSharedMemory(128, optin)) << optin;
  }
  EXPECT_TRUE(TcFitsSharedMemory(64, kOptinSm86));
  EXPECT_FALSE(TcFitsSharedMemory(96, kOptinSm86));
  EXPECT_FALSE(TcFitsSharedMemory(128, kOptinSm86));
  EXPECT_FALSE(TcFitsSharedMemory(96, TcMaxSharedBytes<96>() - 1));
  EXPECT_FALSE(TcFitsSharedMemory(128, TcMaxSharedBytes<128>() - 1));
  EXPECT_TRUE(TcFitsSharedMemory(128, TcMaxSharedBytes<128>()));
}

}  // namespace
}  // namespace packsched::kernels::internal::cuda
