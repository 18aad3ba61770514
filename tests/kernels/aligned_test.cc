// PackAligned / UnpackAligned (the TransformerEngine THD layout) on the CPU backend.

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "packsched/kernels/kernels.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels {
namespace {

using testing::CuSeqlens;
using testing::CuTensor;
using testing::HostTensor;

TEST(AlignedCuSeqlensTest, RoundsEachLengthUpAndKeepsEmptySequencesEmpty) {
  const auto padded = AlignedCuSeqlens({0, 1, 1, 5, 13}, 4);  // lengths 1, 0, 4, 8
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(*padded, (std::vector<int32_t>{0, 4, 4, 8, 16}));
}

TEST(AlignedCuSeqlensTest, RejectsBadArguments) {
  EXPECT_EQ(AlignedCuSeqlens({0, 3}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AlignedCuSeqlens({0, 3, 2}, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AlignedCuSeqlens({0, 2147483000}, 1024).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// `v` in dtype T (v is small and integral here, so every dtype holds it exactly).
template <typename T>
T Cast(double v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(v);
  } else {
    return FromAcc<T>(static_cast<Acc<T>>(v));
  }
}

template <typename T>
class AlignedTest : public ::testing::Test {};
using CopyTypes =
    ::testing::Types<uint8_t, int8_t, int16_t, int32_t, int64_t, float, double, Fp16, Bf16>;
TYPED_TEST_SUITE(AlignedTest, CopyTypes);

TYPED_TEST(AlignedTest, PacksWithPadValueAndUnpacksBack) {
  const double pad_value = 7;
  for (const auto& lengths : testing::LengthSweeps()) {
    for (int64_t align : {1, 8, 64}) {
      for (int64_t width : {0, 3}) {
        for (int64_t tail : {0, 5}) {  // rows past the padded total: the align_total_to tail
          SCOPED_TRACE(::testing::Message() << "B=" << lengths.size() << " align=" << align
                                            << " width=" << width << " tail=" << tail);
          const std::vector<int32_t> cu = CuSeqlens(lengths);
          const auto padded = AlignedCuSeqlens(cu, align);
          ASSERT_TRUE(padded.ok());
          const int64_t row = std::max<int64_t>(width, 1);
          auto shape = [&](int64_t rows) {
            return width > 0 ? std::vector<int64_t>{rows, width} : std::vector<int64_t>{rows};
          };
          HostTensor x(shape(cu.back()), testing::DTypeOf<TypeParam>());
          x.FillRandomBytes(3);
          HostTensor cu_t = CuTensor(cu);
          const int64_t rows = padded->back() + tail;
          HostTensor x_aligned(shape(rows), testing::DTypeOf<TypeParam>());
          HostTensor cu_padded = HostTensor::Zeros<int32_t>({static_cast<int64_t>(cu.size())});
          HostTensor seqused = HostTensor::Zeros<int32_t>({static_cast<int64_t>(lengths.size())});
          ASSERT_TRUE(PackAligned(x.view(), {&cu_t.view(), {}}, align, tail > 0 ? rows : -1,
                                  pad_value, x_aligned.view(), cu_padded.view(), seqused.view(),
                                  nullptr)
                          .ok());
          EXPECT_EQ(cu_padded.values<int32_t>(), *padded);
          EXPECT_EQ(seqused.values<int32_t>(), lengths);

          // Reference: sequence b's rows at padded[b]; pad slots and the tail equal pad_value.
          const TypeParam pad = Cast<TypeParam>(pad_value);
          std::vector<TypeParam> want(x_aligned.numel(), pad);
          const std::vector<TypeParam> xv = x.values<TypeParam>();
          for (size_t b = 0; b < lengths.size(); ++b) {
            std::copy(xv.begin() + cu[b] * row, xv.begin() + cu[b + 1] * row,
                      want.begin() + (*padded)[b] * row);
          }
          HostTensor want_t = HostTensor::Of<TypeParam>(shape(rows), want);
          EXPECT_EQ(x_aligned.bytes(), want_t.bytes());

          HostTensor x_back(shape(cu.back()), testing::DTypeOf<TypeParam>());
          ASSERT_TRUE(UnpackAligned(x_aligned.view(), {&cu_t.view(), {}},
                                    {&cu_padded.view(), {}, tail > 0 ? rows : -1}, x_back.view(),
                                    nullptr)
                          .ok());
          EXPECT_EQ(x_back.bytes(), x.bytes());
        }
      }
    }
  }
}

TEST(AlignedTest, UnpackAcceptsAnyPaddingThatHoldsTheRealTokens) {
  // Lengths 2 and 1 stored in segments of 3 and 4 rows (not a common multiple).
  HostTensor x_aligned = HostTensor::Of<int64_t>({7}, {10, 11, -1, 20, -1, -1, -1});
  HostTensor cu = CuTensor({0, 2, 3});
  HostTensor cu_padded = CuTensor({0, 3, 7});
  HostTensor x = HostTensor::Zeros<int64_t>({3});
  ASSERT_TRUE(
      UnpackAligned(x_aligned.view(), {&cu.view(), {}}, {&cu_padded.view(), {}}, x.view(), nullptr)
          .ok());
  EXPECT_EQ(x.values<int64_t>(), (std::vector<int64_t>{10, 11, 20}));
}

TEST(AlignedTest, TailRowsMustNotBeFewerThanThePaddedTotal) {
  HostTensor x = HostTensor::Zeros<int32_t>({3});
  HostTensor cu = CuTensor({0, 3});
  HostTensor x_aligned = HostTensor::Zeros<int32_t>({3});
  HostTensor cu_padded = HostTensor::Zeros<int32_t>({2});
  HostTensor seqused = HostTensor::Zeros<int32_t>({1});
  const absl::Status s = PackAligned(x.view(), {&cu.view(), {}}, 4, 3, 0.0, x_aligned.view(),
                                     cu_padded.view(), seqused.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rows = 3 must be -1 (no tail) or at least the padded total 4"),
            absl::string_view::npos)
      << s;
  // The input layout cannot carry a tail of its own.
  const absl::Status t = PackAligned(x.view(), {&cu.view(), {}, 5}, 1, -1, 0.0, x_aligned.view(),
                                     cu_padded.view(), seqused.view(), nullptr);
  EXPECT_EQ(t.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.message().find("cu_seqlens must declare no tail here"), absl::string_view::npos) << t;
}

TEST(AlignedTest, RejectsAPadValueTheDtypeCannotHold) {
  HostTensor x = HostTensor::Zeros<uint8_t>({1});
  HostTensor cu = CuTensor({0, 1});
  HostTensor x_aligned = HostTensor::Zeros<uint8_t>({2});
  HostTensor cu_padded = HostTensor::Zeros<int32_t>({2});
  HostTensor seqused = HostTensor::Zeros<int32_t>({1});
  for (double bad : {256.0, -1.0, 0.5}) {
    const absl::Status s = PackAligned(x.view(), {&cu.view(), {}}, 2, -1, bad, x_aligned.view(),
                                       cu_padded.view(), seqused.view(), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("pad_value"), absl::string_view::npos) << s;
  }
}

TEST(AlignedTest, UnpackRejectsPaddedSegmentsShorterThanTheSequences) {
  HostTensor x_aligned = HostTensor::Zeros<float>({3});
  HostTensor cu = CuTensor({0, 2, 3});
  HostTensor cu_padded = CuTensor({0, 1, 3});
  HostTensor x = HostTensor::Zeros<float>({3});
  const absl::Status s =
      UnpackAligned(x_aligned.view(), {&cu.view(), {}}, {&cu_padded.view(), {}}, x.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sequence 0"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace packsched::kernels
