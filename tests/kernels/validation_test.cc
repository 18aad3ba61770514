// Every call validates its arguments on the host and names the offending one. One test per kind
// of mistake; each checks the status code and that the message names the argument.

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "packsched/kernels/kernels.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels {
namespace {

using testing::CuTensor;
using ::testing::HasSubstr;
using testing::HostTensor;

MATCHER_P(InvalidArgumentWith, text, "") {
  return arg.code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.message()).find(text) != std::string::npos;
}

// A valid position_ids call over lengths {2, 1}, to break one argument at a time.
struct PositionCall {
  HostTensor cu = CuTensor({0, 2, 3});
  HostTensor pos = HostTensor::Zeros<int64_t>({3});
  absl::Status Run(std::vector<int32_t> host = {}) {
    return PositionIds({&cu.view(), host}, pos.view(), nullptr);
  }
};

TEST(ValidationTest, TheBaselineCallIsValid) { EXPECT_TRUE(PositionCall().Run().ok()); }

TEST(ValidationTest, CuSeqlensMustBeInt32) {
  PositionCall c;
  c.cu = HostTensor::Of<int64_t>({3}, {0, 2, 3});
  EXPECT_THAT(c.Run(), InvalidArgumentWith("cu_seqlens must be int32, got int64"));
}

TEST(ValidationTest, CuSeqlensMustBeOneDimensional) {
  PositionCall c;
  c.cu = HostTensor::Of<int32_t>({1, 3}, {0, 2, 3});
  EXPECT_THAT(c.Run(), InvalidArgumentWith("cu_seqlens must have shape [B + 1]"));
  c.cu = HostTensor::Zeros<int32_t>({0});
  EXPECT_THAT(c.Run(), InvalidArgumentWith("cu_seqlens must have shape [B + 1]"));
}

TEST(ValidationTest, CuSeqlensMustStartAtZero) {
  PositionCall c;
  c.cu = CuTensor({1, 2, 3});
  EXPECT_THAT(c.Run(), InvalidArgumentWith("cu_seqlens[0] must be 0, got 1"));
}

TEST(ValidationTest, CuSeqlensMustBeNonDecreasing) {
  PositionCall c;
  c.cu = CuTensor({0, 3, 2});
  EXPECT_THAT(c.Run(), InvalidArgumentWith("cu_seqlens[2] = 2 < cu_seqlens[1] = 3"));
}

TEST(ValidationTest, HostCopyMustMatchAHostTensor) {
  PositionCall c;
  EXPECT_TRUE(c.Run({0, 2, 3}).ok());
  EXPECT_THAT(c.Run({0, 1, 3}),
              InvalidArgumentWith("host copy differs from the tensor at index 1"));
  EXPECT_THAT(c.Run({0, 3}), InvalidArgumentWith("host copy has 2 values but the tensor has 3"));
}

TEST(ValidationTest, OutputTotalMustMatchCuSeqlens) {
  PositionCall c;
  c.pos = HostTensor::Zeros<int64_t>({4});
  EXPECT_THAT(c.Run(), InvalidArgumentWith("position_ids must have shape [total] = [3], got [4]"));
}

TEST(ValidationTest, InputTotalMustMatchCuSeqlens) {
  HostTensor ids = HostTensor::Zeros<int64_t>({5});
  HostTensor cu = CuTensor({0, 2, 3});
  HostTensor labels = HostTensor::Zeros<int64_t>({5});
  EXPECT_THAT(ShiftLabels(ids.view(), {&cu.view(), {}}, nullptr, -100, labels.view(), nullptr),
              InvalidArgumentWith("total mismatch: ids has shape [5] but cu_seqlens[B] = 3"));
}

TEST(ValidationTest, OutputDtypeIsChecked) {
  PositionCall c;
  c.pos = HostTensor::Zeros<int32_t>({3});
  EXPECT_THAT(c.Run(), InvalidArgumentWith("position_ids must be int64, got int32"));
}

TEST(ValidationTest, UnsupportedDtypesAreNamed) {
  HostTensor logits = HostTensor::Zeros<int32_t>({1, 4});
  HostTensor labels = HostTensor::Zeros<int64_t>({1});
  HostTensor cu = CuTensor({0, 1});
  HostTensor loss = HostTensor::Zeros<int32_t>({1});
  HostTensor sums = HostTensor::Zeros<int32_t>({1});
  HostTensor counts = HostTensor::Zeros<int64_t>({1});
  EXPECT_THAT(PackedCrossEntropy(logits.view(), labels.view(), {&cu.view(), {}}, -100, loss.view(),
                                 sums.view(), counts.view(), nullptr),
              InvalidArgumentWith("unsupported dtype for logits: int32"));

  HostTensor x = HostTensor::Zeros<float>({1, 2});
  HostTensor mask = HostTensor::Zeros<float>({1, 2});
  HostTensor cu1 = CuTensor({0, 0});
  HostTensor x_packed = HostTensor::Zeros<float>({0});
  HostTensor indices = HostTensor::Zeros<int64_t>({0});
  EXPECT_THAT(
      Unpad(x.view(), mask.view(), {&cu1.view(), {}}, x_packed.view(), indices.view(), nullptr),
      InvalidArgumentWith("unsupported dtype for mask: float32"));

  HostTensor complex = HostTensor::Zeros<int64_t>({1, 2});
  complex.mutable_view().dtype = {kDLComplex, 64, 1};
  EXPECT_THAT(Unpad(complex.view(), mask.view(), {&cu1.view(), {}}, x_packed.view(), indices.view(),
                    nullptr),
              InvalidArgumentWith("unsupported dtype for x"));
}

TEST(ValidationTest, OutputsMustShareTheInputDtype) {
  HostTensor x = HostTensor::Zeros<float>({2});
  HostTensor cu = CuTensor({0, 2});
  HostTensor x_aligned = HostTensor::Zeros<double>({4});
  HostTensor cu_padded = HostTensor::Zeros<int32_t>({2});
  HostTensor seqused = HostTensor::Zeros<int32_t>({1});
  EXPECT_THAT(PackAligned(x.view(), {&cu.view(), {}}, 4, -1, 0.0, x_aligned.view(),
                          cu_padded.view(), seqused.view(), nullptr),
              InvalidArgumentWith("x_aligned must have x_packed's dtype float32, got float64"));
}

TEST(ValidationTest, ShapesAreChecked) {
  HostTensor x = HostTensor::Zeros<float>({2, 3, 4});
  HostTensor mask = HostTensor::Zeros<uint8_t>({2, 4});
  HostTensor cu = CuTensor({0, 0, 0});
  HostTensor x_packed = HostTensor::Zeros<float>({0, 4});
  HostTensor indices = HostTensor::Zeros<int64_t>({0});
  EXPECT_THAT(
      Unpad(x.view(), mask.view(), {&cu.view(), {}}, x_packed.view(), indices.view(), nullptr),
      InvalidArgumentWith("mask must have shape [B, S] = [2, 3], got [2, 4]"));
  HostTensor mask_ok = HostTensor::Zeros<uint8_t>({2, 3});
  HostTensor x_packed_bad = HostTensor::Zeros<float>({0, 5});
  EXPECT_THAT(Unpad(x.view(), mask_ok.view(), {&cu.view(), {}}, x_packed_bad.view(), indices.view(),
                    nullptr),
              InvalidArgumentWith("x_packed must have shape [total, ...] = [0, 4], got [0, 5]"));
  HostTensor cu_b3 = CuTensor({0, 0, 0, 0});
  EXPECT_THAT(Unpad(x.view(), mask_ok.view(), {&cu_b3.view(), {}}, x_packed.view(), indices.view(),
                    nullptr),
              InvalidArgumentWith("cu_seqlens has B = 3 sequences but x has B = 2"));
  HostTensor cu_long = CuTensor({0, 4, 4});
  HostTensor x_packed4 = HostTensor::Zeros<float>({4, 4});
  HostTensor indices4 = HostTensor::Zeros<int64_t>({4});
  EXPECT_THAT(Unpad(x.view(), mask_ok.view(), {&cu_long.view(), {}}, x_packed4.view(),
                    indices4.view(), nullptr),
              InvalidArgumentWith("more than the mask's row length S = 3"));
}

TEST(ValidationTest, TensorsMustBeContiguous) {
  HostTensor ids = HostTensor::Zeros<int64_t>({3});
  int64_t strides[] = {2};
  ids.mutable_view().strides = strides;
  HostTensor cu = CuTensor({0, 3});
  HostTensor labels = HostTensor::Zeros<int64_t>({3});
  EXPECT_THAT(ShiftLabels(ids.view(), {&cu.view(), {}}, nullptr, -100, labels.view(), nullptr),
              InvalidArgumentWith("ids must be contiguous"));
}

// Regression: torch exports empty tensors with arbitrary strides; they hold no data to misread.
TEST(ValidationTest, EmptyTensorsMayHaveAnyStrides) {
  HostTensor cu = CuTensor({0, 0});
  HostTensor logits = HostTensor::Zeros<float>({0, 5});
  int64_t strides[] = {1, 0};
  logits.mutable_view().strides = strides;
  HostTensor labels = HostTensor::Zeros<int64_t>({0});
  HostTensor loss = HostTensor::Zeros<float>({0});
  HostTensor sums = HostTensor::Zeros<float>({1});
  HostTensor counts = HostTensor::Zeros<int64_t>({1});
  EXPECT_TRUE(PackedCrossEntropy(logits.view(), labels.view(), {&cu.view(), {}}, -100, loss.view(),
                                 sums.view(), counts.view(), nullptr)
                  .ok());
}

TEST(ValidationTest, AllTensorsMustBeOnOneDevice) {
  HostTensor ids = HostTensor::Zeros<int64_t>({3});
  HostTensor cu = CuTensor({0, 3});
  HostTensor labels = HostTensor::Zeros<int64_t>({3});
  labels.mutable_view().device = {kDLCUDA, 0};
  EXPECT_THAT(ShiftLabels(ids.view(), {&cu.view(), {}}, nullptr, -100, labels.view(), nullptr),
              InvalidArgumentWith("device mismatch: labels is on cuda:0 but ids is on cpu"));
}

TEST(ValidationTest, UnsupportedDevicesAreRejected) {
  PositionCall c;
  c.cu.mutable_view().device = {kDLOpenCL, 0};
  EXPECT_THAT(c.Run(), InvalidArgumentWith("cu_seqlens is on an unsupported device"));
}

TEST(ValidationTest, CudaTensorsNeedAHostCopyOfCuSeqlens) {
  // Fails before any device memory is touched, so this runs everywhere.
  PositionCall c;
  c.cu.mutable_view().device = {kDLCUDA, 0};
  c.pos.mutable_view().device = {kDLCUDA, 0};
  EXPECT_THAT(c.Run(), InvalidArgumentWith("its host copy (Seqlens::host) is required"));
}

TEST(ValidationTest, CudaTensorsAreUnimplementedInABuildWithoutCuda) {
  if (BuiltWithCuda()) GTEST_SKIP() << "built with CUDA (kernels_cuda_test covers this build)";
  PositionCall c;
  c.cu.mutable_view().device = {kDLCUDA, 0};
  c.pos.mutable_view().device = {kDLCUDA, 0};
  const absl::Status s = c.Run({0, 2, 3});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("built without CUDA"));
}

TEST(ValidationTest, NullTensorsAreNamed) {
  HostTensor pos = HostTensor::Zeros<int64_t>({0});
  EXPECT_THAT(PositionIds({nullptr, {}}, pos.view(), nullptr),
              InvalidArgumentWith("cu_seqlens is null"));
}

TEST(ValidationTest, AFailedCallWritesNothing) {
  HostTensor x = HostTensor::Of<float>({2}, {1.0f, 2.0f});
  HostTensor cu = CuTensor({0, 2});
  HostTensor x_aligned = HostTensor::Of<float>({4}, {9, 9, 9, 9});
  HostTensor cu_padded = HostTensor::Zeros<int32_t>({2});
  HostTensor seqused = HostTensor::Zeros<int32_t>({2});  // wrong: [B] = [1]
  EXPECT_THAT(PackAligned(x.view(), {&cu.view(), {}}, 4, -1, 0.0, x_aligned.view(),
                          cu_padded.view(), seqused.view(), nullptr),
              InvalidArgumentWith("seqused must have shape [B] = [1], got [2]"));
  EXPECT_EQ(x_aligned.values<float>(), (std::vector<float>{9, 9, 9, 9}));
}

TEST(ValidationTest, EmptyBatchesAreValidEverywhere) {
  HostTensor cu = CuTensor({0});
  HostTensor none64 = HostTensor::Zeros<int64_t>({0});
  EXPECT_TRUE(PositionIds({&cu.view(), {}}, none64.view(), nullptr).ok());
  HostTensor logits = HostTensor::Zeros<float>({0, 8});
  HostTensor loss = HostTensor::Zeros<float>({0});
  EXPECT_TRUE(PackedCrossEntropy(logits.view(), none64.view(), {&cu.view(), {}}, -100, loss.view(),
                                 loss.view(), none64.view(), nullptr)
                  .ok());
}

}  // namespace
}  // namespace packsched::kernels
