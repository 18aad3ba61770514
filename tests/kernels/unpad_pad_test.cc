// Unpad and Pad on the CPU backend, against a plain reference, bit for bit.

#include <algorithm>
#include <cstdint>
#include <numeric>
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

// A padded batch whose row b has lengths[b] tokens scattered at random positions of S.
struct PaddedBatch {
  int64_t batch, seqlen;
  std::vector<uint8_t> mask;  // [B, S]
};

PaddedBatch RandomMask(const std::vector<int32_t>& lengths, uint32_t seed) {
  PaddedBatch p;
  p.batch = lengths.size();
  p.seqlen = 3 + (lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end()));
  p.mask.assign(p.batch * p.seqlen, 0);
  std::mt19937 rng(seed);
  for (int64_t b = 0; b < p.batch; ++b) {
    std::vector<int64_t> slots(p.seqlen);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int32_t i = 0; i < lengths[b]; ++i) p.mask[b * p.seqlen + slots[i]] = 1;
  }
  return p;
}

template <typename T>
class UnpadPadTest : public ::testing::Test {};

using CopyTypes =
    ::testing::Types<uint8_t, int8_t, int16_t, int32_t, int64_t, float, double, Fp16, Bf16>;
TYPED_TEST_SUITE(UnpadPadTest, CopyTypes);

TYPED_TEST(UnpadPadTest, UnpadMatchesReferenceAndPadInvertsIt) {
  for (const auto& lengths : testing::LengthSweeps()) {
    for (int64_t width : {0, 1, 5}) {  // 0: one element per token ([B, S]); else [B, S, width]
      SCOPED_TRACE(::testing::Message() << "B=" << lengths.size() << " width=" << width);
      const PaddedBatch p = RandomMask(lengths, 7 + lengths.size());
      const std::vector<int32_t> cu = CuSeqlens(lengths);
      const int64_t total = cu.back();
      const int64_t row = std::max<int64_t>(width, 1);
      std::vector<int64_t> x_shape = {p.batch, p.seqlen};
      std::vector<int64_t> packed_shape = {total};
      if (width > 0) {
        x_shape.push_back(width);
        packed_shape.push_back(width);
      }
      HostTensor x(x_shape, testing::DTypeOf<TypeParam>());
      x.FillRandomBytes(11);
      HostTensor mask = HostTensor::Of<uint8_t>({p.batch, p.seqlen}, p.mask);
      HostTensor cu_t = CuTensor(cu);
      HostTensor x_packed(packed_shape, testing::DTypeOf<TypeParam>());
      HostTensor indices = HostTensor::Zeros<int64_t>({total});

      ASSERT_TRUE(
          Unpad(x.view(), mask.view(), {&cu_t.view(), {}}, x_packed.view(), indices.view(), nullptr)
              .ok());

      // Reference: indices are the nonzero mask positions in row-major order.
      std::vector<int64_t> want_indices;
      for (int64_t i = 0; i < p.batch * p.seqlen; ++i) {
        if (p.mask[i]) want_indices.push_back(i);
      }
      EXPECT_EQ(indices.values<int64_t>(), want_indices);
      const size_t row_bytes = row * sizeof(TypeParam);
      std::vector<uint8_t> want_packed;
      const std::vector<uint8_t> xb = x.bytes();
      for (int64_t i : want_indices) {
        want_packed.insert(want_packed.end(), xb.begin() + i * row_bytes,
                           xb.begin() + (i + 1) * row_bytes);
      }
      EXPECT_EQ(x_packed.bytes(), want_packed);

      // Pad restores the token rows and zeroes every other row.
      HostTensor x_back(x_shape, testing::DTypeOf<TypeParam>());
      x_back.FillRandomBytes(5);  // garbage that Pad must overwrite
      ASSERT_TRUE(Pad(x_packed.view(), indices.view(), x_back.view(), nullptr).ok());
      std::vector<uint8_t> want_x(xb.size(), 0);
      for (int64_t i : want_indices) {
        std::copy(xb.begin() + i * row_bytes, xb.begin() + (i + 1) * row_bytes,
                  want_x.begin() + i * row_bytes);
      }
      EXPECT_EQ(x_back.bytes(), want_x);
    }
  }
}

TEST(UnpadTest, AcceptsEveryMaskDtype) {
  const std::vector<int32_t> lengths = {2, 0, 3};
  const PaddedBatch p = RandomMask(lengths, 3);
  const std::vector<int32_t> cu = CuSeqlens(lengths);
  HostTensor x = HostTensor::Zeros<float>({p.batch, p.seqlen});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i);
  HostTensor cu_t = CuTensor(cu);

  std::vector<HostTensor> masks;
  masks.push_back(HostTensor::Of<uint8_t>({p.batch, p.seqlen}, p.mask));
  masks.push_back(HostTensor::Of<uint8_t>({p.batch, p.seqlen}, p.mask));
  masks.back().mutable_view().dtype = {6, 8, 1};  // bool
  std::vector<int8_t> m8(p.mask.begin(), p.mask.end());
  std::vector<int32_t> m32(p.mask.begin(), p.mask.end());
  std::vector<int64_t> m64(p.mask.begin(), p.mask.end());
  for (auto& v : m64) v *= -7;  // any nonzero value is a token
  masks.push_back(HostTensor::Of<int8_t>({p.batch, p.seqlen}, m8));
  masks.push_back(HostTensor::Of<int32_t>({p.batch, p.seqlen}, m32));
  masks.push_back(HostTensor::Of<int64_t>({p.batch, p.seqlen}, m64));

  std::vector<float> first;
  for (const HostTensor& mask : masks) {
    HostTensor x_packed = HostTensor::Zeros<float>({cu.back()});
    HostTensor indices = HostTensor::Zeros<int64_t>({cu.back()});
    ASSERT_TRUE(
        Unpad(x.view(), mask.view(), {&cu_t.view(), {}}, x_packed.view(), indices.view(), nullptr)
            .ok());
    std::vector<float> want;
    for (int64_t i = 0; i < p.batch * p.seqlen; ++i) {
      if (p.mask[i]) want.push_back(static_cast<float>(i));
    }
    EXPECT_EQ(x_packed.values<float>(), want);
  }
}

TEST(UnpadTest, RejectsAMaskRowThatDisagreesWithCuSeqlens) {
  HostTensor x = HostTensor::Zeros<float>({2, 4});
  HostTensor mask = HostTensor::Of<uint8_t>({2, 4}, {1, 1, 0, 0, 1, 0, 0, 0});
  HostTensor cu = CuTensor({0, 2, 4});  // row 1 has one token, not two
  HostTensor x_packed = HostTensor::Zeros<float>({4});
  HostTensor indices = HostTensor::Zeros<int64_t>({4});
  const absl::Status s =
      Unpad(x.view(), mask.view(), {&cu.view(), {}}, x_packed.view(), indices.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("mask row 1 has 1 tokens"), absl::string_view::npos) << s;
  EXPECT_EQ(indices.values<int64_t>(), std::vector<int64_t>(4, 0)) << "nothing written";
}

TEST(PadTest, RejectsAnIndexOutOfRange) {
  HostTensor x_packed = HostTensor::Zeros<float>({2});
  HostTensor indices = HostTensor::Of<int64_t>({2}, {0, 6});
  HostTensor x = HostTensor::Zeros<float>({2, 3});
  const absl::Status s = Pad(x_packed.view(), indices.view(), x.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("indices[1] = 6"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace packsched::kernels
