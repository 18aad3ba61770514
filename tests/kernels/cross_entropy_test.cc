// PackedCrossEntropy on the CPU backend against a float64 reference over the same (rounded)
// logits. Tolerance: one unit in the last place of the output dtype plus the float32
// accumulation error; float64 must agree to 1e-12.

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "packsched/kernels/kernels.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels {
namespace {

using testing::CuSeqlens;
using testing::CuTensor;
using testing::HostTensor;

template <typename T>
double Epsilon() {
  if constexpr (std::is_same_v<T, Fp16>) return std::ldexp(1.0, -10);
  if constexpr (std::is_same_v<T, Bf16>) return std::ldexp(1.0, -7);
  if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -23);
  return std::ldexp(1.0, -52);
}

template <typename T>
double Tolerance(double ref, int64_t terms) {
  const double accumulate = std::is_same_v<T, double> ? 1e-12 : 4e-6 * std::sqrt(terms + 1.0);
  return (Epsilon<T>() + accumulate) * (1.0 + std::abs(ref));
}

template <typename T>
class CrossEntropyTest : public ::testing::Test {};
using FloatTypes = ::testing::Types<Fp16, Bf16, float, double>;
TYPED_TEST_SUITE(CrossEntropyTest, FloatTypes);

TYPED_TEST(CrossEntropyTest, MatchesAFloat64Reference) {
  using T = TypeParam;
  std::mt19937 rng(2);
  std::normal_distribution<double> normal(0.0, 3.0);
  for (const auto& lengths : testing::LengthSweeps()) {
    for (int64_t vocab : {1, 7, 300}) {
      SCOPED_TRACE(::testing::Message() << "B=" << lengths.size() << " V=" << vocab);
      const std::vector<int32_t> cu = CuSeqlens(lengths);
      const int64_t rows = cu.back();
      std::vector<T> logits(rows * vocab);
      for (auto& l : logits) l = FromAcc<T>(static_cast<Acc<T>>(normal(rng)));
      std::vector<int64_t> labels(rows);
      for (auto& l : labels) l = rng() % 5 == 0 ? -100 : static_cast<int64_t>(rng() % vocab);

      HostTensor logits_t = HostTensor::Of<T>({rows, vocab}, logits);
      HostTensor labels_t = HostTensor::Of<int64_t>({rows}, labels);
      HostTensor cu_t = CuTensor(cu);
      const int64_t batch = lengths.size();
      HostTensor loss(std::vector<int64_t>{rows}, testing::DTypeOf<T>());
      HostTensor sums(std::vector<int64_t>{batch}, testing::DTypeOf<T>());
      HostTensor counts = HostTensor::Zeros<int64_t>({batch});
      loss.FillRandomBytes(1);
      ASSERT_TRUE(PackedCrossEntropy(logits_t.view(), labels_t.view(), {&cu_t.view(), {}}, -100,
                                     loss.view(), sums.view(), counts.view(), nullptr)
                      .ok());

      const std::vector<T> got = loss.values<T>();
      for (int64_t t = 0; t < rows; ++t) {
        if (labels[t] == -100) {
          EXPECT_EQ(ToAcc(got[t]), 0.0) << "t=" << t;
          continue;
        }
        double m = -INFINITY;
        for (int64_t v = 0; v < vocab; ++v) m = std::max<double>(m, ToAcc(logits[t * vocab + v]));
        double s = 0;
        for (int64_t v = 0; v < vocab; ++v) s += std::exp(ToAcc(logits[t * vocab + v]) - m);
        const double want = m + std::log(s) - ToAcc(logits[t * vocab + labels[t]]);
        EXPECT_NEAR(ToAcc(got[t]), want, Tolerance<T>(want, vocab)) << "t=" << t;
      }
      const std::vector<T> got_sums = sums.values<T>();
      const std::vector<int64_t> got_counts = counts.values<int64_t>();
      for (int64_t b = 0; b < batch; ++b) {
        double want = 0;
        int64_t want_count = 0;
        for (int64_t t = cu[b]; t < cu[b + 1]; ++t) {
          want += ToAcc(got[t]);
          want_count += labels[t] != -100;
        }
        EXPECT_NEAR(ToAcc(got_sums[b]), want, Tolerance<T>(want, cu[b + 1] - cu[b])) << "b=" << b;
        EXPECT_EQ(got_counts[b], want_count) << "b=" << b;
      }
    }
  }
}

TEST(CrossEntropyTest, UniformLogitsGiveLogV) {
  HostTensor logits = HostTensor::Of<float>({2, 4}, std::vector<float>(8, 0.25f));
  HostTensor labels = HostTensor::Of<int32_t>({2}, {3, -100});
  HostTensor cu = CuTensor({0, 2});
  HostTensor loss = HostTensor::Zeros<float>({2});
  HostTensor sums = HostTensor::Zeros<float>({1});
  HostTensor counts = HostTensor::Zeros<int64_t>({1});
  ASSERT_TRUE(PackedCrossEntropy(logits.view(), labels.view(), {&cu.view(), {}}, -100, loss.view(),
                                 sums.view(), counts.view(), nullptr)
                  .ok());
  EXPECT_NEAR(loss.values<float>()[0], std::log(4.0f), 1e-6);
  EXPECT_EQ(loss.values<float>()[1], 0.0f);
  EXPECT_NEAR(sums.values<float>()[0], std::log(4.0f), 1e-6);
  EXPECT_EQ(counts.values<int64_t>()[0], 1);
}

// Tail rows (past cu[B]) give loss 0 and count nowhere, whatever their labels hold (here even a
// label outside the vocabulary, which a real row would be rejected for).
TEST(CrossEntropyTest, TailRowsContributeNothing) {
  HostTensor logits = HostTensor::Of<float>({4, 4}, std::vector<float>(16, 0.5f));
  HostTensor labels = HostTensor::Of<int32_t>({4}, {1, 2, 3, 99});
  HostTensor cu = CuTensor({0, 2});
  HostTensor loss = HostTensor::Of<float>({4}, std::vector<float>(4, NAN));
  HostTensor sums = HostTensor::Zeros<float>({1});
  HostTensor counts = HostTensor::Zeros<int64_t>({1});
  ASSERT_TRUE(PackedCrossEntropy(logits.view(), labels.view(), {&cu.view(), {}, 4}, -100,
                                 loss.view(), sums.view(), counts.view(), nullptr)
                  .ok());
  const std::vector<float> l = loss.values<float>();
  EXPECT_NEAR(l[0], std::log(4.0f), 1e-6);
  EXPECT_NEAR(l[1], std::log(4.0f), 1e-6);
  EXPECT_EQ(l[2], 0.0f);
  EXPECT_EQ(l[3], 0.0f);
  EXPECT_NEAR(sums.values<float>()[0], 2 * std::log(4.0f), 1e-6);
  EXPECT_EQ(counts.values<int64_t>()[0], 2);
}

TEST(CrossEntropyTest, RejectsALabelOutsideTheVocabulary) {
  HostTensor logits = HostTensor::Zeros<float>({2, 4});
  HostTensor labels = HostTensor::Of<int64_t>({2}, {1, 4});
  HostTensor cu = CuTensor({0, 2});
  HostTensor loss = HostTensor::Zeros<float>({2});
  HostTensor sums = HostTensor::Zeros<float>({1});
  HostTensor counts = HostTensor::Zeros<int64_t>({1});
  const absl::Status s = PackedCrossEntropy(logits.view(), labels.view(), {&cu.view(), {}}, -100,
                                            loss.view(), sums.view(), counts.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("labels[1] = 4"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace packsched::kernels
