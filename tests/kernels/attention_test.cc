// Varlen attention on the CPU backend against a float64 naive reference, under the tolerance rule
// of docs/design.md §4 (2x the naive-in-dtype error for out and lse, 3x for gradients; +inf lse
// rows equal), over length pairs, dtypes, head dims, GQA ratios, windows, softcap and the padded
// (aligned) layout; plus the contract's special rows, determinism, and float64 gradients against
// finite differences.

#include "packsched/kernels/attention.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels {
namespace {

using testing::AttentionTensors;
using testing::CheckAgainstReference;
using testing::HostTensor;
using testing::Inputs;
using testing::MakeProblem;
using testing::OnlyTailProblem;
using testing::Outputs;
using testing::Problem;
using testing::RandomInputs;
using testing::TailProblem;

// Batch 1, every pair of distinct lengths from {0, 1, 97, 128, 1025} that keeps the test fast
// (1025 x 1025 is left to the all-lengths batch's 1025 x 128).
TEST(AttentionTest, LengthPairsBatchOfOne) {
  const int32_t pairs[][2] = {{0, 1},    {1, 0},      {1, 97},   {97, 1},  {97, 128},
                              {128, 97}, {128, 1025}, {1025, 1}, {0, 128}, {128, 128}};
  for (const auto& pair : pairs) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "sq=" << pair[0] << " sk=" << pair[1] << " causal=" << causal);
      CheckAgainstReference<Bf16>(MakeProblem({pair[0]}, {pair[1]}, causal));
    }
  }
}

// Scores that rise from key tile to key tile (RisingKeys): the online softmax rescales what it
// has accumulated, in float32 and bf16.
TEST(AttentionTest, RisingScoresAcrossKeyTiles) {
  const Problem p = MakeProblem({300, 40}, {300, 40}, true);
  CheckAgainstReference<float>(p, 3, testing::RisingKeys<float>);
  CheckAgainstReference<Bf16>(p, 3, testing::RisingKeys<Bf16>);
}

TEST(AttentionTest, AllLengthsInOneBatchWithEmptySequences) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    CheckAgainstReference<float>(
        MakeProblem({0, 1, 97, 0, 128, 1025, 0}, {1, 97, 0, 128, 97, 128, 0}, causal));
  }
}

TEST(AttentionTest, EmptyBatch) {
  CheckAgainstReference<float>(MakeProblem({}, {}));
  CheckAgainstReference<float>(MakeProblem({0, 0}, {0, 0}, true));
}

TEST(AttentionTest, EveryDtype) {
  Problem p = MakeProblem({97, 128, 1}, {128, 97, 5}, true);
  p.heads = 4;
  p.kv_heads = 2;
  CheckAgainstReference<Fp16>(p);
  CheckAgainstReference<Bf16>(p);
  CheckAgainstReference<float>(p);
  CheckAgainstReference<double>(p);
}

TEST(AttentionTest, HeadDims) {
  for (int64_t d : {8, 64, 80, 128, 256}) {
    SCOPED_TRACE(d);
    Problem p = MakeProblem({33, 70}, {70, 33}, true);
    p.head_dim = d;
    CheckAgainstReference<float>(p);
    CheckAgainstReference<Bf16>(p);
  }
}

TEST(AttentionTest, GqaAndMqaRatios) {
  for (auto [h, hk] : {std::pair{3, 3}, {4, 2}, {4, 1}, {6, 3}, {8, 2}}) {
    SCOPED_TRACE(::testing::Message() << "H=" << h << " Hk=" << hk);
    Problem p = MakeProblem({40, 65}, {65, 40}, true);
    p.heads = h;
    p.kv_heads = hk;
    p.head_dim = 32;
    CheckAgainstReference<float>(p);
  }
}

TEST(AttentionTest, SlidingWindows) {
  const int64_t windows[][2] = {{16, 0}, {-1, 8}, {32, 32}, {0, 0}, {5, -1}, {200, 3}};
  for (const auto& w : windows) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "window=(" << w[0] << "," << w[1] << ") causal=" << causal);
      Problem p = MakeProblem({97, 130}, {150, 97}, causal);
      p.options.window_left = w[0];
      p.options.window_right = w[1];
      CheckAgainstReference<float>(p);
      CheckAgainstReference<Fp16>(p);
    }
  }
}

// attention.h (FlashAttention's varlen rule): a window side >= max_seqlen_k is unbounded. With
// sq = 4 > sk = 2 the right side matters: window (-1, 2) with max_seqlen_k = 2 is plain attention
// (query 0 sees both keys), while with a hint of 3 the window holds (query 0 sees key 0 only).
TEST(AttentionTest, WindowSideAtLeastMaxSeqlenKIsUnbounded) {
  Problem p = MakeProblem({4}, {2});
  p.head_dim = 8;
  p.options.window_right = 2;
  CheckAgainstReference<float>(p);
  const Inputs in = RandomInputs<double>(p, 3);

  Problem unbounded = p;
  unbounded.options.window_right = -1;
  AttentionTensors<double> windowed(p, in), plain(unbounded, in);
  ASSERT_TRUE(windowed.Forward(p.options).ok());
  ASSERT_TRUE(windowed.Backward(p.options).ok());
  ASSERT_TRUE(plain.Forward(unbounded.options).ok());
  ASSERT_TRUE(plain.Backward(unbounded.options).ok());
  const Outputs w = windowed.Results(), u = plain.Results();
  EXPECT_EQ(w.out, u.out);
  EXPECT_EQ(w.lse, u.lse);
  EXPECT_EQ(w.dq, u.dq);
  EXPECT_EQ(w.dk, u.dk);
  EXPECT_EQ(w.dv, u.dv);

  Problem hinted = p;
  hinted.max_seqlen_k = 3;
  CheckAgainstReference<float>(hinted);
  AttentionTensors<double> h(hinted, in);
  ASSERT_TRUE(h.Forward(hinted.options).ok());
  const Outputs r = h.Results();
  // Query 0 (both heads read kv head 0) sees key 0 alone: out = v_0 exactly.
  for (int64_t e = 0; e < p.heads * p.head_dim; ++e) {
    EXPECT_EQ(r.out[e], in.v[e % p.head_dim]) << e;
  }
  EXPECT_NE(u.out[0], in.v[0]);
}

// Windows near INT64_MAX are unbounded too, whether the front end normalises them (>=
// max_seqlen_k) or, under a max_seqlen_k hint above them, the tile arithmetic sees them as they
// are (it must not overflow: the bug was lse = +inf and out = 0 everywhere).
TEST(AttentionTest, WindowsNearInt64MaxAreUnbounded) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (bool causal : {false, true}) {
    Problem base = MakeProblem({4, 9}, {4, 2}, causal);  // sq > sk in the second sequence
    base.head_dim = 8;
    const Inputs in = RandomInputs<double>(base, 5);
    AttentionTensors<double> plain(base, in);
    ASSERT_TRUE(plain.Forward(base.options).ok());
    ASSERT_TRUE(plain.Backward(base.options).ok());
    const Outputs u = plain.Results();
    const int64_t windows[][2] = {
        {-1, kMax}, {kMax, -1}, {int64_t{1} << 62, int64_t{1} << 62}, {kMax - 1, kMax - 1}};
    for (int64_t hint : {int64_t{-1}, kMax}) {
      for (const auto& w : windows) {
        SCOPED_TRACE(::testing::Message() << "causal=" << causal << " max_seqlen_k=" << hint
                                          << " window=(" << w[0] << ", " << w[1] << ")");
        Problem p = base;
        p.max_seqlen_k = hint;
        p.options.window_left = w[0];
        p.options.window_right = w[1];
        AttentionTensors<double> t(p, in);
        ASSERT_TRUE(t.Forward(p.options).ok()) << t.Forward(p.options);
        ASSERT_TRUE(t.Backward(p.options).ok());
        const Outputs r = t.Results();
        EXPECT_EQ(r.out, u.out);
        EXPECT_EQ(r.lse, u.lse);
        EXPECT_EQ(r.dq, u.dq);
        EXPECT_EQ(r.dk, u.dk);
        EXPECT_EQ(r.dv, u.dv);
      }
    }
  }
}

TEST(AttentionTest, SoftcapAndScale) {
  Problem p = MakeProblem({97, 64}, {64, 130}, true);
  p.options.softcap = 2.5;
  CheckAgainstReference<float>(p);
  CheckAgainstReference<Bf16>(p);
  p.options.window_left = 20;
  p.options.softmax_scale = 0.4;  // large enough for the cap to bite
  CheckAgainstReference<float>(p);
  CheckAgainstReference<double>(p);
}

// PackAligned's layout: pad slots (NaN inputs) are never keys and never matter as queries; the
// real rows equal the packed layout's bit for bit, pad rows are out = 0, lse = +inf, grads 0.
TEST(AttentionTest, PaddedOffsetsWithSeqused) {
  Problem padded = MakeProblem({97, 0, 40, 5}, {60, 13, 128, 0}, true);
  padded.pad_q = {3, 8, 0, 11};
  padded.pad_k = {4, 3, 64, 2};
  padded.options.window_left = 50;
  CheckAgainstReference<Bf16>(padded);
  CheckAgainstReference<double>(padded);

  Problem packed = MakeProblem(padded.len_q, padded.len_k);
  packed.options = padded.options;
  const Inputs in_padded = RandomInputs<float>(padded, 7);
  AttentionTensors<float> a(padded, in_padded);
  ASSERT_TRUE(a.Forward(padded.options).ok());
  ASSERT_TRUE(a.Backward(padded.options).ok());
  // The same real rows, packed without pads.
  Inputs in_packed;
  const std::vector<int32_t> cu_pq = padded.CuQ(), cu_pk = padded.CuK();
  const int64_t qw = padded.heads * padded.head_dim, kw = padded.kv_heads * padded.head_dim;
  for (int64_t b = 0; b < padded.batch(); ++b) {
    auto copy = [](const std::vector<double>& src, int64_t row, int64_t n, int64_t width,
                   std::vector<double>& dst) {
      dst.insert(dst.end(), src.begin() + row * width, src.begin() + (row + n) * width);
    };
    copy(in_padded.q, cu_pq[b], padded.len_q[b], qw, in_packed.q);
    copy(in_padded.dout, cu_pq[b], padded.len_q[b], qw, in_packed.dout);
    copy(in_padded.k, cu_pk[b], padded.len_k[b], kw, in_packed.k);
    copy(in_padded.v, cu_pk[b], padded.len_k[b], kw, in_packed.v);
  }
  AttentionTensors<float> b(packed, in_packed);
  ASSERT_TRUE(b.Forward(packed.options).ok());
  ASSERT_TRUE(b.Backward(packed.options).ok());
  const Outputs pa = a.Results(), pb = b.Results();
  const std::vector<int32_t> cu_q = packed.CuQ(), cu_k = packed.CuK();
  const int64_t tq_padded = cu_pq.back(), tq = cu_q.back();
  for (int64_t s = 0; s < padded.batch(); ++s) {
    for (int64_t i = 0; i < cu_pq[s + 1] - cu_pq[s]; ++i) {
      const bool real = i < padded.len_q[s];
      for (int64_t e = 0; e < qw; ++e) {
        const int64_t at = (cu_pq[s] + i) * qw + e;
        EXPECT_EQ(pa.out[at], real ? pb.out[(cu_q[s] + i) * qw + e] : 0.0);
        EXPECT_EQ(pa.dq[at], real ? pb.dq[(cu_q[s] + i) * qw + e] : 0.0);
      }
      for (int64_t h = 0; h < padded.heads; ++h) {
        EXPECT_EQ(pa.lse[h * tq_padded + cu_pq[s] + i],
                  real ? pb.lse[h * tq + cu_q[s] + i] : std::numeric_limits<double>::infinity());
      }
    }
    for (int64_t j = 0; j < cu_pk[s + 1] - cu_pk[s]; ++j) {
      const bool real = j < padded.len_k[s];
      for (int64_t e = 0; e < kw; ++e) {
        const int64_t at = (cu_pk[s] + j) * kw + e;
        EXPECT_EQ(pa.dk[at], real ? pb.dk[(cu_k[s] + j) * kw + e] : 0.0);
        EXPECT_EQ(pa.dv[at], real ? pb.dv[(cu_k[s] + j) * kw + e] : 0.0);
      }
    }
  }
}

// The align_total_to tail (rows past cu[B], declared by Seqlens::rows): its q rows see no key and
// its k/v rows are never keys (they hold NaN here, which would poison any output that read them);
// out, dq, dk, dv are 0 and lse +inf there, and every real row matches the reference.
TEST(AttentionTest, TailRowsAreDefinedAndNeverKeys) {
  const Problem p = TailProblem(/*tail_q=*/70);
  CheckAgainstReference<float>(p);
  CheckAgainstReference<double>(p);
  Problem packed = MakeProblem({5, 9}, {5, 9});
  packed.tail_q = 2;
  packed.tail_k = 2;
  CheckAgainstReference<Bf16>(packed);
  CheckAgainstReference<float>(OnlyTailProblem());
}

// Bottom-right causal with sq > sk: the first sq - sk queries see no key.
TEST(AttentionTest, RowsThatSeeNoKeyGetZeroOutputAndInfiniteLse) {
  Problem p = MakeProblem({5}, {2}, true);
  p.heads = 1;
  p.head_dim = 8;
  const Inputs in = RandomInputs<float>(p, 3);
  AttentionTensors<float> t(p, in);
  ASSERT_TRUE(t.Forward(p.options).ok());
  ASSERT_TRUE(t.Backward(p.options).ok());
  const Outputs r = t.Results();
  for (int64_t i = 0; i < 5; ++i) {
    const bool sees = i >= 3;
    EXPECT_EQ(std::isinf(r.lse[i]), !sees) << i;
    for (int64_t d = 0; d < 8; ++d) {
      if (!sees) {
        EXPECT_EQ(r.out[i * 8 + d], 0.0) << i;
        EXPECT_EQ(r.dq[i * 8 + d], 0.0) << i;
      }
    }
  }
  // Query 3 sees only key 0: its output is v_0 exactly (softmax of one element is 1).
  for (int64_t d = 0; d < 8; ++d) EXPECT_FLOAT_EQ(r.out[3 * 8 + d], in.v[d]);
}

TEST(AttentionTest, BackwardIsDeterministicAndIndependentOfThreads) {
  Problem p = MakeProblem({300, 97, 1025}, {200, 128, 97}, true);
  p.heads = 4;
  p.kv_heads = 1;
  p.head_dim = 64;
  const Inputs in = RandomInputs<Bf16>(p, 11);
  std::vector<std::vector<uint8_t>> runs;
  for (int threads : {4, 4, 1, 3}) {
    AttentionTensors<Bf16> t(p, in);
    p.options.num_threads = threads;
    ASSERT_TRUE(t.Forward(p.options).ok());
    ASSERT_TRUE(t.Backward(p.options).ok());
    std::vector<uint8_t> all;
    for (const HostTensor* x : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv}) {
      const std::vector<uint8_t> b = x->bytes();
      all.insert(all.end(), b.begin(), b.end());
    }
    runs.push_back(all);
  }
  for (size_t i = 1; i < runs.size(); ++i) EXPECT_TRUE(runs[i] == runs[0]) << "run " << i;
}

// float64: the backward equals the central differences of L = sum(dout * out).
TEST(AttentionTest, Float64GradientsMatchFiniteDifferences) {
  Problem p = MakeProblem({5, 0, 7}, {6, 2, 7}, true);
  p.heads = 2;
  p.kv_heads = 1;
  p.head_dim = 8;
  p.options.window_left = 4;
  p.options.softcap = 1.5;
  p.options.num_threads = 1;
  const Inputs in = RandomInputs<double>(p, 5);
  AttentionTensors<double> t(p, in);
  ASSERT_TRUE(t.Forward(p.options).ok());
  ASSERT_TRUE(t.Backward(p.options).ok());
  const Outputs grads = t.Results();
  const std::vector<double> dout = in.dout;
  auto loss = [&]() {
    EXPECT_TRUE(t.Forward(p.options).ok());
    const std::vector<double> out = AttentionTensors<double>::Values(t.out);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
    return l;
  };
  const double h = 1e-6;
  auto check = [&](HostTensor& x, const std::vector<double>& grad, const char* name) {
    double* data = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = data[i];
      data[i] = saved + h;
      const double up = loss();
      data[i] = saved - h;
      const double down = loss();
      data[i] = saved;
      EXPECT_NEAR(grad[i], (up - down) / (2 * h), 1e-7) << name << "[" << i << "]";
    }
  };
  check(t.q, grads.dq, "dq");
  check(t.k, grads.dk, "dk");
  check(t.v, grads.dv, "dv");
}

}  // namespace
}  // namespace packsched::kernels
