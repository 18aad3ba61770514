// The CUDA backend against the CPU backend on the same inputs: copy kernels, positions and labels
// bit for bit, cross entropy within the float32 accumulation tolerance. Skips without a device
// (cudaGetDeviceCount failing or returning 0); without one, the last test checks that calls fail
// cleanly instead.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "packsched/kernels/context_parallel.h"
#include "packsched/kernels/kernels.h"
#include "tests/kernels/device_tensor.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels {
namespace {

using testing::CuSeqlens;
using testing::CuTensor;
using testing::DeviceTensor;
using testing::HaveDevice;
using testing::HostTensor;

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaTest, UnpadAndPadMatchTheCpuBackend) {
  std::mt19937 rng(1);
  for (const auto& lengths : testing::LengthSweeps()) {
    for (int64_t width : {1, 3, 64, 4096}) {  // vector widths 1..16 bytes, warp-per-row path
      SCOPED_TRACE(::testing::Message() << "B=" << lengths.size() << " width=" << width);
      const std::vector<int32_t> cu = CuSeqlens(lengths);
      const int64_t batch = lengths.size();
      const int64_t seqlen = 2 + (cu.back() > 0 ? 1025 : 0);
      std::vector<uint8_t> mask(batch * seqlen, 0);
      for (int64_t b = 0; b < batch; ++b) {
        for (int32_t i = 0; i < lengths[b]; ++i) mask[b * seqlen + (i * 7 + b) % seqlen] = 1;
      }
      HostTensor x(std::vector<int64_t>{batch, seqlen, width}, testing::DTypeOf<Bf16>());
      x.FillRandomBytes(rng());
      HostTensor mask_t = HostTensor::Of<uint8_t>({batch, seqlen}, mask);
      HostTensor cu_t = CuTensor(cu);
      HostTensor packed(std::vector<int64_t>{cu.back(), width}, testing::DTypeOf<Bf16>());
      HostTensor indices = HostTensor::Zeros<int64_t>({cu.back()});
      ASSERT_TRUE(
          Unpad(x.view(), mask_t.view(), {&cu_t.view(), {}}, packed.view(), indices.view(), nullptr)
              .ok());

      DeviceTensor dx(x), dmask(mask_t), dcu(cu_t), dpacked(packed), dindices(indices);
      ASSERT_TRUE(Unpad(dx.view(), dmask.view(), {&dcu.view(), cu}, dpacked.view(), dindices.view(),
                        nullptr)
                      .ok());
      EXPECT_EQ(dindices.bytes(), indices.bytes());
      EXPECT_EQ(dpacked.bytes(), packed.bytes());

      HostTensor padded(std::vector<int64_t>{batch, seqlen, width}, testing::DTypeOf<Bf16>());
      ASSERT_TRUE(Pad(packed.view(), indices.view(), padded.view(), nullptr).ok());
      DeviceTensor dpadded(padded);
      ASSERT_TRUE(Pad(dpacked.view(), dindices.view(), dpadded.view(), nullptr).ok());
      EXPECT_EQ(dpadded.bytes(), padded.bytes());
    }
  }
}

TEST_F(CudaTest, AlignedPackingMatchesTheCpuBackend) {
  for (const auto& lengths : testing::LengthSweeps()) {
    for (int64_t width : {1, 5, 256}) {
      SCOPED_TRACE(::testing::Message() << "B=" << lengths.size() << " width=" << width);
      const std::vector<int32_t> cu = CuSeqlens(lengths);
      const std::vector<int32_t> padded = *AlignedCuSeqlens(cu, 16);
      const int64_t batch = lengths.size();
      HostTensor x = HostTensor::Zeros<float>({cu.back(), width});
      x.FillRandomBytes(9);
      HostTensor cu_t = CuTensor(cu);
      HostTensor aligned = HostTensor::Zeros<float>({padded.back(), width});
      HostTensor cu_padded = HostTensor::Zeros<int32_t>({batch + 1});
      HostTensor seqused = HostTensor::Zeros<int32_t>({batch});
      ASSERT_TRUE(PackAligned(x.view(), {&cu_t.view(), {}}, 16, -1, -1.5, aligned.view(),
                              cu_padded.view(), seqused.view(), nullptr)
                      .ok());
      DeviceTensor dx(x), dcu(cu_t), daligned(aligned), dcu_padded(cu_padded), dseqused(seqused);
      ASSERT_TRUE(PackAligned(dx.view(), {&dcu.view(), cu}, 16, -1, -1.5, daligned.view(),
                              dcu_padded.view(), dseqused.view(), nullptr)
                      .ok());
      EXPECT_EQ(daligned.bytes(), aligned.bytes());
      EXPECT_EQ(dcu_padded.bytes(), cu_padded.bytes());
      EXPECT_EQ(dseqused.bytes(), seqused.bytes());

      HostTensor back = HostTensor::Zeros<float>({cu.back(), width});
      DeviceTensor dback(back);
      ASSERT_TRUE(UnpackAligned(daligned.view(), {&dcu.view(), cu}, {&dcu_padded.view(), padded},
                                dback.view(), nullptr)
                      .ok());
      EXPECT_EQ(dback.bytes(), x.bytes());
    }
  }
}

// The align_total_to tail (rows past the last offset) on the device: packing fills it, positions
// restart at 0, labels are ignore_index, cross entropy writes 0; all as the CPU backend does.
TEST_F(CudaTest, TheTailMatchesTheCpuBackend) {
  for (const auto& lengths : testing::LengthSweeps()) {
    SCOPED_TRACE(::testing::Message() << "B=" << lengths.size());
    const std::vector<int32_t> cu = CuSeqlens(lengths);
    const std::vector<int32_t> padded = *AlignedCuSeqlens(cu, 4);
    const int64_t batch = lengths.size();
    const int64_t rows = padded.back() + 7;
    HostTensor x = HostTensor::Zeros<int64_t>({cu.back()});
    x.FillRandomBytes(5);
    HostTensor cu_t = CuTensor(cu);
    HostTensor aligned = HostTensor::Zeros<int64_t>({rows});
    HostTensor cu_padded = HostTensor::Zeros<int32_t>({batch + 1});
    HostTensor seqused = HostTensor::Zeros<int32_t>({batch});
    ASSERT_TRUE(PackAligned(x.view(), {&cu_t.view(), {}}, 4, rows, 3.0, aligned.view(),
                            cu_padded.view(), seqused.view(), nullptr)
                    .ok());
    DeviceTensor dx(x), dcu(cu_t), daligned(aligned), dcu_padded(cu_padded), dseqused(seqused);
    ASSERT_TRUE(PackAligned(dx.view(), {&dcu.view(), cu}, 4, rows, 3.0, daligned.view(),
                            dcu_padded.view(), dseqused.view(), nullptr)
                    .ok());
    EXPECT_EQ(daligned.bytes(), aligned.bytes());

    const Seqlens layout{&cu_padded.view(), {}, rows};
    const Seqlens dlayout{&dcu_padded.view(), padded, rows};
    HostTensor pos = HostTensor::Zeros<int64_t>({rows});
    ASSERT_TRUE(PositionIds(layout, pos.view(), nullptr).ok());
    DeviceTensor dpos(pos);
    ASSERT_TRUE(PositionIds(dlayout, dpos.view(), nullptr).ok());
    EXPECT_EQ(dpos.bytes(), pos.bytes());

    HostTensor labels = HostTensor::Zeros<int64_t>({rows});
    ASSERT_TRUE(
        ShiftLabels(aligned.view(), {&cu_t.view(), {}}, &layout, -100, labels.view(), nullptr)
            .ok());
    DeviceTensor dlabels(labels);
    ASSERT_TRUE(
        ShiftLabels(daligned.view(), {&dcu.view(), cu}, &dlayout, -100, dlabels.view(), nullptr)
            .ok());
    EXPECT_EQ(dlabels.bytes(), labels.bytes());

    std::mt19937 rng(6);
    std::normal_distribution<float> normal(0.f, 4.f);
    std::vector<float> logit_values(rows * 3);
    for (auto& l : logit_values) l = normal(rng);
    HostTensor logits = HostTensor::Of<float>({rows, 3}, logit_values);
    std::vector<int64_t> ce_labels(rows, 1);  // even tail rows carry a label: it is not read
    HostTensor ce_labels_t = HostTensor::Of<int64_t>({rows}, ce_labels);
    HostTensor loss = HostTensor::Zeros<float>({rows});
    HostTensor sums = HostTensor::Zeros<float>({batch});
    HostTensor counts = HostTensor::Zeros<int64_t>({batch});
    ASSERT_TRUE(PackedCrossEntropy(logits.view(), ce_labels_t.view(), layout, -100, loss.view(),
                                   sums.view(), counts.view(), nullptr)
                    .ok());
    DeviceTensor dlogits(logits), dce_labels(ce_labels_t), dloss(loss), dsums(sums),
        dcounts(counts);
    ASSERT_TRUE(PackedCrossEntropy(dlogits.view(), dce_labels.view(), dlayout, -100, dloss.view(),
                                   dsums.view(), dcounts.view(), nullptr)
                    .ok());
    HostTensor got_t = HostTensor::Zeros<float>({rows});
    dloss.CopyTo(got_t);
    const std::vector<float> got = got_t.values<float>();
    const std::vector<float> want = loss.values<float>();
    for (int64_t t = 0; t < padded.back(); ++t) {
      EXPECT_NEAR(got[t], want[t], 1e-5 * (1 + std::abs(want[t]))) << "t=" << t;
    }
    for (int64_t t = padded.back(); t < rows; ++t) EXPECT_EQ(got[t], 0.0f) << t;
    HostTensor got_sums_t = HostTensor::Zeros<float>({batch});
    dsums.CopyTo(got_sums_t);
    const std::vector<float> got_sums = got_sums_t.values<float>();
    const std::vector<float> want_sums = sums.values<float>();
    for (int64_t b = 0; b < batch; ++b) {
      EXPECT_NEAR(got_sums[b], want_sums[b], 1e-4 * (1 + std::abs(want_sums[b]))) << "b=" << b;
    }
    EXPECT_EQ(dcounts.bytes(), counts.bytes());
  }
}

TEST_F(CudaTest, PositionsAndLabelsMatchTheCpuBackend) {
  std::mt19937 rng(4);
  for (const auto& lengths : testing::LengthSweeps()) {
    const std::vector<int32_t> cu = CuSeqlens(lengths);
    const std::vector<int32_t> padded = *AlignedCuSeqlens(cu, 8);
    HostTensor cu_t = CuTensor(cu);
    HostTensor cu_padded = CuTensor(padded);
    HostTensor pos = HostTensor::Zeros<int64_t>({padded.back()});
    ASSERT_TRUE(PositionIds({&cu_padded.view(), {}}, pos.view(), nullptr).ok());
    DeviceTensor dcu(cu_t), dcu_padded(cu_padded), dpos(pos);
    ASSERT_TRUE(PositionIds({&dcu_padded.view(), padded}, dpos.view(), nullptr).ok());
    EXPECT_EQ(dpos.bytes(), pos.bytes());

    std::vector<int32_t> ids(padded.back());
    for (auto& id : ids) id = rng() % 1000;
    HostTensor ids_t = HostTensor::Of<int32_t>({padded.back()}, ids);
    HostTensor labels = HostTensor::Zeros<int32_t>({padded.back()});
    const Seqlens host_padded{&cu_padded.view(), {}};
    ASSERT_TRUE(
        ShiftLabels(ids_t.view(), {&cu_t.view(), {}}, &host_padded, -100, labels.view(), nullptr)
            .ok());
    DeviceTensor dids(ids_t), dlabels(labels);
    const Seqlens device_padded{&dcu_padded.view(), padded};
    ASSERT_TRUE(
        ShiftLabels(dids.view(), {&dcu.view(), cu}, &device_padded, -100, dlabels.view(), nullptr)
            .ok());
    EXPECT_EQ(dlabels.bytes(), labels.bytes());
  }
}

TEST_F(CudaTest, CrossEntropyMatchesTheCpuBackend) {
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.f, 4.f);
  for (int64_t vocab : {1, 37, 32000}) {
    const std::vector<int32_t> cu = CuSeqlens({0, 1, 97, 0, 128});
    const int64_t rows = cu.back();
    std::vector<float> logits(rows * vocab);
    for (auto& l : logits) l = normal(rng);
    std::vector<int64_t> labels(rows);
    for (auto& l : labels) l = rng() % 4 == 0 ? -100 : static_cast<int64_t>(rng() % vocab);
    HostTensor logits_t = HostTensor::Of<float>({rows, vocab}, logits);
    HostTensor labels_t = HostTensor::Of<int64_t>({rows}, labels);
    HostTensor cu_t = CuTensor(cu);
    const int64_t batch = cu.size() - 1;
    HostTensor loss = HostTensor::Zeros<float>({rows});
    HostTensor sums = HostTensor::Zeros<float>({batch});
    HostTensor counts = HostTensor::Zeros<int64_t>({batch});
    ASSERT_TRUE(PackedCrossEntropy(logits_t.view(), labels_t.view(), {&cu_t.view(), {}}, -100,
                                   loss.view(), sums.view(), counts.view(), nullptr)
                    .ok());
    DeviceTensor dlogits(logits_t), dlabels(labels_t), dcu(cu_t), dloss(loss), dsums(sums),
        dcounts(counts);
    ASSERT_TRUE(PackedCrossEntropy(dlogits.view(), dlabels.view(), {&dcu.view(), cu}, -100,
                                   dloss.view(), dsums.view(), dcounts.view(), nullptr)
                    .ok());
    std::vector<float> got(rows);
    const std::vector<uint8_t> b = dloss.bytes();
    std::memcpy(got.data(), b.data(), b.size());
    const std::vector<float> want = loss.values<float>();
    for (int64_t t = 0; t < rows; ++t) {
      EXPECT_NEAR(got[t], want[t], 1e-5 * (1 + std::abs(want[t]))) << "t=" << t << " V=" << vocab;
    }
    EXPECT_EQ(dcounts.bytes(), counts.bytes());
  }
}

TEST_F(CudaTest, CpShardAndUnshardMatchTheCpuBackend) {
  // Any group size: dynamic CP forms groups of 3 where sizes are free.
  std::mt19937 rng(6);
  for (int64_t cp : {1, 2, 3, 4}) {
    for (const auto& lengths : testing::LengthSweeps()) {
      for (int64_t width : {1, 6, 256}) {  // vector widths 1..16 bytes, warp-per-row path
        SCOPED_TRACE(::testing::Message()
                     << "cp=" << cp << " B=" << lengths.size() << " width=" << width);
        const std::vector<int32_t> cu = *AlignedCuSeqlens(CuSeqlens(lengths), 2 * cp);
        const int64_t total = cu.back();
        HostTensor x(std::vector<int64_t>{total, width}, testing::DTypeOf<Bf16>());
        x.FillRandomBytes(rng());
        HostTensor cu_t = CuTensor(cu);
        DeviceTensor dx(x), dcu(cu_t);
        HostTensor zeros(std::vector<int64_t>{total, width}, testing::DTypeOf<Bf16>());
        DeviceTensor drebuilt(zeros);
        for (int64_t rank = 0; rank < cp; ++rank) {
          HostTensor shard(std::vector<int64_t>{total / cp, width}, testing::DTypeOf<Bf16>());
          ASSERT_TRUE(CpShard(x.view(), {&cu_t.view(), {}}, cp, rank, shard.view(), nullptr).ok());
          DeviceTensor dshard(shard);
          ASSERT_TRUE(CpShard(dx.view(), {&dcu.view(), cu}, cp, rank, dshard.view(), nullptr).ok());
          EXPECT_EQ(dshard.bytes(), shard.bytes());
          ASSERT_TRUE(
              CpUnshard(dshard.view(), {&dcu.view(), cu}, cp, rank, drebuilt.view(), nullptr).ok());
        }
        EXPECT_EQ(drebuilt.bytes(), x.bytes());
      }
    }
  }
}

TEST_F(CudaTest, MropePositionIdsMatchTheCpuBackend) {
  // Two sequences with images and a video (merge 2), one text-only, one empty, and a tail.
  const std::vector<int32_t> types = {0, 1, 1, 1, 1, 1, 1, 0, 0, 2, 2, 2, 2, 2,
                                      2, 2, 2, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0};
  const std::vector<int32_t> cu = {0, 18, 22, 22, 25};
  const int64_t rows = static_cast<int64_t>(types.size());
  HostTensor types_t = HostTensor::Of<int32_t>({rows}, types);
  HostTensor cu_t = CuTensor(cu);
  HostTensor grids = HostTensor::Of<int32_t>({3, 3}, {1, 4, 6, 2, 4, 4, 1, 2, 4});
  const std::vector<int32_t> grid_cu = {0, 2, 2, 2, 3};
  HostTensor grid_cu_t = CuTensor(grid_cu);
  HostTensor pos = HostTensor::Zeros<int64_t>({3, rows});
  ASSERT_TRUE(MropePositionIds(types_t.view(), {&cu_t.view(), {}, rows}, grids.view(),
                               {&grid_cu_t.view(), {}}, 2, pos.view(), nullptr)
                  .ok());
  DeviceTensor dtypes(types_t), dcu(cu_t), dgrids(grids), dgrid_cu(grid_cu_t), dpos(pos);
  ASSERT_TRUE(MropePositionIds(dtypes.view(), {&dcu.view(), cu, rows}, dgrids.view(),
                               {&dgrid_cu.view(), grid_cu}, 2, dpos.view(), nullptr)
                  .ok());
  EXPECT_EQ(dpos.bytes(), pos.bytes());
}

TEST(CudaWithoutDeviceTest, CallsFailCleanly) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present";
  // Device tensors that are never dereferenced: the launch fails first.
  HostTensor cu = CuTensor({0, 3});
  HostTensor pos = HostTensor::Zeros<int64_t>({3});
  cu.mutable_view().device = {kDLCUDA, 0};
  pos.mutable_view().device = {kDLCUDA, 0};
  const absl::Status s = PositionIds({&cu.view(), std::vector<int32_t>{0, 3}}, pos.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("no usable CUDA device"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace packsched::kernels
