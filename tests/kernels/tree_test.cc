// The tree-packing kernels of tree.h on the CPU backend: depths from subtree_end against the
// forests' own depths, and the multi-target cross entropy (forward and backward) against a direct
// float64 computation; the attention's tree predicate (TreeKeyVisible) against the rollouts' paths.

#include "packsched/kernels/tree.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/common/half.h"
#include "kernels/common/tree.h"
#include "tests/kernels/host_tensor.h"
#include "tests/kernels/tree_forest.h"

namespace packsched::kernels {
namespace {

using testing::CuTensor;
using testing::DTypeOf;
using testing::HostTensor;
using testing::PackedForest;
using testing::RandomForest;

MATCHER_P(InvalidArgumentWith, text, "") {
  *result_listener << "status: " << arg;
  return arg.code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.message()).find(text) != std::string::npos;
}

// Query i sees key j <= i exactly when some rollout's path holds both (within the window, on
// depths): the mask rule every attention kernel applies through TreeKeyVisible.
TEST(TreeKeyVisibleTest, EqualsSharingARolloutPath) {
  for (const int64_t window : {int64_t{-1}, int64_t{0}, int64_t{3}}) {
    const PackedForest f = RandomForest(/*seed=*/5, /*trees=*/3, /*max_nodes=*/9, /*max_len=*/4);
    const size_t rows = f.subtree_end.size();
    std::vector<std::vector<bool>> shared(rows, std::vector<bool>(rows, false));
    for (const std::vector<int64_t>& path : f.rollout_rows) {
      for (size_t a = 0; a < path.size(); ++a) {
        for (size_t b = 0; b <= a; ++b) {
          const int64_t gap = f.positions[path[a]] - f.positions[path[b]];
          if (window < 0 || gap <= window) shared[path[a]][path[b]] = true;
        }
      }
    }
    int64_t seen = 0;
    for (size_t piece = 0; piece + 1 < f.cu.size(); ++piece) {
      for (int64_t i = f.cu[piece]; i < f.cu[piece + 1]; ++i) {
        for (int64_t j = f.cu[piece]; j <= i; ++j) {
          const bool visible =
              TreeKeyVisible(i, f.subtree_end[j], f.positions[i], f.positions[j], window);
          EXPECT_EQ(visible, shared[i][j]) << "i " << i << " j " << j << " window " << window;
          seen += visible;
        }
      }
    }
    // Each row sees itself; with a window of 0 nothing else (depths grow along a path).
    if (window == 0) {
      EXPECT_EQ(seen, static_cast<int64_t>(rows));
    } else {
      EXPECT_GT(seen, static_cast<int64_t>(rows));
    }
  }
}

TEST(TreePositionIdsTest, DepthsOfRandomForestsWithATail) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    const PackedForest f = RandomForest(seed, 4, 15, 6);
    std::vector<int32_t> ends = f.subtree_end;
    const int64_t tail = 3;
    ends.insert(ends.end(), tail, 0);  // tail rows are not read
    const int64_t rows = static_cast<int64_t>(ends.size());
    HostTensor cu = CuTensor(f.cu);
    HostTensor se = HostTensor::Of<int32_t>({rows}, ends);
    HostTensor out = HostTensor::Zeros<int64_t>({rows});
    ASSERT_TRUE(TreePositionIds({&cu.view(), {}, rows}, se.view(), out.view(), nullptr).ok());
    std::vector<int64_t> want(f.positions.begin(), f.positions.end());
    for (int64_t t = 0; t < tail; ++t) want.push_back(t);
    EXPECT_EQ(out.values<int64_t>(), want) << "seed " << seed;
  }
}

TEST(TreePositionIdsTest, FlatSequencesCountFromTheirStart) {
  HostTensor cu = CuTensor({0, 3, 3, 5});
  HostTensor se = HostTensor::Of<int32_t>({5}, {3, 3, 3, 5, 5});
  HostTensor out = HostTensor::Zeros<int64_t>({5});
  ASSERT_TRUE(TreePositionIds({&cu.view(), {}}, se.view(), out.view(), nullptr).ok());
  EXPECT_EQ(out.values<int64_t>(), (std::vector<int64_t>{0, 1, 2, 0, 1}));
}

TEST(TreePositionIdsTest, RejectsBadArguments) {
  HostTensor cu = CuTensor({0, 3});
  HostTensor out = HostTensor::Zeros<int64_t>({3});
  HostTensor past = HostTensor::Of<int32_t>({3}, {3, 4, 3});
  EXPECT_THAT(TreePositionIds({&cu.view(), {}}, past.view(), out.view(), nullptr),
              InvalidArgumentWith("subtree_end[1] = 4"));
  HostTensor self = HostTensor::Of<int32_t>({3}, {3, 1, 3});
  EXPECT_THAT(TreePositionIds({&cu.view(), {}}, self.view(), out.view(), nullptr),
              InvalidArgumentWith("subtree_end[1] = 1"));
  HostTensor short_se = HostTensor::Of<int32_t>({2}, {2, 2});
  EXPECT_THAT(TreePositionIds({&cu.view(), {}}, short_se.view(), out.view(), nullptr),
              InvalidArgumentWith("subtree_end"));
  HostTensor int32_out = HostTensor::Zeros<int32_t>({3});
  HostTensor ok = HostTensor::Of<int32_t>({3}, {3, 3, 3});
  EXPECT_THAT(TreePositionIds({&cu.view(), {}}, ok.view(), int32_out.view(), nullptr),
              InvalidArgumentWith("position_ids"));
}

// Targets: several on some rows, none on others (rows 1 and 5), duplicates of a label on a row.
struct Targets {
  std::vector<int64_t> rows = {0, 0, 2, 2, 2, 3, 4, 4, 6};
  std::vector<int64_t> labels = {1, 4, 0, 0, 6, 3, 2, 5, 6};
  std::vector<double> d_loss = {0.5, -1.0, 2.0, 0.25, 1.0, -0.75, 1.5, 0.125, 3.0};
};

constexpr int64_t kRows = 7;
constexpr int64_t kVocab = 7;

std::vector<double> RandomLogits(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 2.0);
  std::vector<double> x(kRows * kVocab);
  for (double& v : x) v = normal(rng);
  return x;
}

template <typename T>
void CheckMultiTarget(double tolerance) {
  const Targets tg;
  std::vector<double> logits = RandomLogits(3);
  for (double& v : logits) v = static_cast<double>(ToAcc(FromAcc<T>(static_cast<Acc<T>>(v))));
  HostTensor lg({kRows, kVocab}, DTypeOf<T>());
  for (int64_t i = 0; i < kRows * kVocab; ++i) {
    lg.data<T>()[i] = FromAcc<T>(static_cast<Acc<T>>(logits[i]));
  }
  const int64_t n = static_cast<int64_t>(tg.rows.size());
  HostTensor rows = HostTensor::Of<int64_t>({n}, tg.rows);
  HostTensor labels = HostTensor::Of<int64_t>({n}, tg.labels);
  HostTensor loss = HostTensor::Zeros<Acc<T>>({n});
  HostTensor lse = HostTensor::Zeros<Acc<T>>({kRows});
  ASSERT_TRUE(MultiTargetCrossEntropy(lg.view(), rows.view(), labels.view(), loss.view(),
                                      lse.view(), nullptr)
                  .ok());
  std::vector<double> row_lse(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < kVocab; ++v) m = std::max(m, logits[r * kVocab + v]);
    for (int64_t v = 0; v < kVocab; ++v) s += std::exp(logits[r * kVocab + v] - m);
    row_lse[r] = m + std::log(s);
    EXPECT_NEAR(lse.values<Acc<T>>()[r], row_lse[r], tolerance);
  }
  for (int64_t i = 0; i < n; ++i) {
    const double want = row_lse[tg.rows[i]] - logits[tg.rows[i] * kVocab + tg.labels[i]];
    EXPECT_NEAR(loss.values<Acc<T>>()[i], want, tolerance) << "target " << i;
  }
  // Backward against the direct sum over targets.
  std::vector<Acc<T>> d(tg.d_loss.begin(), tg.d_loss.end());
  HostTensor d_loss = HostTensor::Of<Acc<T>>({n}, d);
  HostTensor d_logits({kRows, kVocab}, DTypeOf<T>());
  ASSERT_TRUE(MultiTargetCrossEntropyBackward(lg.view(), lse.view(), rows.view(), labels.view(),
                                              d_loss.view(), d_logits.view(), nullptr)
                  .ok());
  std::vector<double> want(kRows * kVocab, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = tg.rows[i];
    for (int64_t v = 0; v < kVocab; ++v) {
      const double p = std::exp(logits[r * kVocab + v] - row_lse[r]);
      want[r * kVocab + v] += tg.d_loss[i] * (p - (v == tg.labels[i] ? 1.0 : 0.0));
    }
  }
  const std::vector<T> got = d_logits.values<T>();
  for (int64_t i = 0; i < kRows * kVocab; ++i) {
    EXPECT_NEAR(static_cast<double>(ToAcc(got[i])), want[i], tolerance * 4) << "d_logits " << i;
  }
}

TEST(MultiTargetCrossEntropyTest, MatchesTheDirectComputation) {
  CheckMultiTarget<double>(1e-12);
  CheckMultiTarget<float>(1e-5);
  CheckMultiTarget<Bf16>(2e-2);
}

// The float64 gradient against central finite differences of sum_i d_loss[i] * loss[i].
TEST(MultiTargetCrossEntropyTest, GradientMatchesFiniteDifferences) {
  const Targets tg;
  const std::vector<double> logits = RandomLogits(8);
  const int64_t n = static_cast<int64_t>(tg.rows.size());
  HostTensor rows = HostTensor::Of<int64_t>({n}, tg.rows);
  HostTensor labels = HostTensor::Of<int64_t>({n}, tg.labels);
  auto objective = [&](const std::vector<double>& x, std::vector<double>* grad) {
    HostTensor lg = HostTensor::Of<double>({kRows, kVocab}, x);
    HostTensor loss = HostTensor::Zeros<double>({n});
    HostTensor lse = HostTensor::Zeros<double>({kRows});
    EXPECT_TRUE(MultiTargetCrossEntropy(lg.view(), rows.view(), labels.view(), loss.view(),
                                        lse.view(), nullptr)
                    .ok());
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += tg.d_loss[i] * loss.values<double>()[i];
    if (grad != nullptr) {
      HostTensor d_loss = HostTensor::Of<double>({n}, tg.d_loss);
      HostTensor d_logits = HostTensor::Zeros<double>({kRows, kVocab});
      EXPECT_TRUE(MultiTargetCrossEntropyBackward(lg.view(), lse.view(), rows.view(), labels.view(),
                                                  d_loss.view(), d_logits.view(), nullptr)
                      .ok());
      *grad = d_logits.values<double>();
    }
    return total;
  };
  std::vector<double> grad;
  objective(logits, &grad);
  for (int64_t i = 0; i < kRows * kVocab; ++i) {
    std::vector<double> plus = logits, minus = logits;
    plus[i] += 1e-6;
    minus[i] -= 1e-6;
    const double fd = (objective(plus, nullptr) - objective(minus, nullptr)) / 2e-6;
    EXPECT_NEAR(grad[i], fd, 1e-6) << "logit " << i;
  }
}

TEST(MultiTargetCrossEntropyTest, RejectsBadTargets) {
  HostTensor lg = HostTensor::Zeros<float>({3, 4});
  HostTensor loss = HostTensor::Zeros<float>({2});
  HostTensor lse = HostTensor::Zeros<float>({3});
  HostTensor labels = HostTensor::Of<int32_t>({2}, {0, 1});
  HostTensor unsorted = HostTensor::Of<int32_t>({2}, {2, 1});
  EXPECT_THAT(MultiTargetCrossEntropy(lg.view(), unsorted.view(), labels.view(), loss.view(),
                                      lse.view(), nullptr),
              InvalidArgumentWith("rows[1] = 1"));
  HostTensor beyond = HostTensor::Of<int32_t>({2}, {0, 3});
  EXPECT_THAT(MultiTargetCrossEntropy(lg.view(), beyond.view(), labels.view(), loss.view(),
                                      lse.view(), nullptr),
              InvalidArgumentWith("rows[1] = 3"));
  HostTensor rows = HostTensor::Of<int32_t>({2}, {0, 1});
  HostTensor bad_label = HostTensor::Of<int32_t>({2}, {0, 4});
  EXPECT_THAT(MultiTargetCrossEntropy(lg.view(), rows.view(), bad_label.view(), loss.view(),
                                      lse.view(), nullptr),
              InvalidArgumentWith("labels[1] = 4"));
  HostTensor labels64 = HostTensor::Of<int64_t>({2}, {0, 1});
  EXPECT_THAT(MultiTargetCrossEntropy(lg.view(), rows.view(), labels64.view(), loss.view(),
                                      lse.view(), nullptr),
              InvalidArgumentWith("labels"));
  HostTensor loss64 = HostTensor::Zeros<double>({2});
  EXPECT_THAT(MultiTargetCrossEntropy(lg.view(), rows.view(), labels.view(), loss64.view(),
                                      lse.view(), nullptr),
              InvalidArgumentWith("loss"));
  HostTensor d_logits = HostTensor::Zeros<float>({3, 5});
  EXPECT_THAT(MultiTargetCrossEntropyBackward(lg.view(), lse.view(), rows.view(), labels.view(),
                                              loss.view(), d_logits.view(), nullptr),
              InvalidArgumentWith("d_logits"));
}

}  // namespace
}  // namespace packsched::kernels
