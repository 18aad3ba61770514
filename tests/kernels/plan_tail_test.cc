// The planner's micro-batch metadata and the kernels agree on the align_total_to tail: packing a
// plan's micro-batch with PackAligned(align_to, rows = total) gives exactly `total` rows, offsets
// equal to the plan's cu_seqlens_aligned, the tail filled with the pad value, positions that
// restart at 0 there and ignore_index labels on it.

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "packsched/kernels/kernels.h"
#include "server/planner/planner.h"
#include "tests/kernels/host_tensor.h"
#include "tests/testing/lengths.h"

namespace packsched::kernels {
namespace {

using testing::CuTensor;
using testing::HostTensor;

TEST(PlanTailTest, PackAlignedBuildsExactlyThePlansTotalRows) {
  constexpr int64_t kAlignTotal = 8;
  constexpr int64_t kPad = -7;
  // Short lengths keep the buffers small; the realistic mix, scaled down, keeps them varied.
  std::vector<int64_t> lengths = packsched::testing::RealisticRlLengths(64, 5);
  for (int64_t& length : lengths) length = length / 200 + 1;
  for (int64_t align_to : {1, 4}) {
    SCOPED_TRACE(align_to);
    planner::PlanOptions options;
    options.max_token_len = 128;
    options.align_to = align_to;
    options.align_total_to = kAlignTotal;
    const auto plan = planner::PlanMicroBatches(lengths, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    int tails = 0;
    for (const planner::MicroBatch& part : plan->parts) {
      const int64_t end = part.cu_seqlens_aligned.back();
      ASSERT_EQ(part.total % kAlignTotal, 0);
      ASSERT_GE(part.total, end);
      tails += part.total > end;
      const int64_t n = part.cu_seqlens.back();
      std::vector<int64_t> ids(n);
      for (int64_t t = 0; t < n; ++t) ids[t] = 1000 + t;
      HostTensor x = HostTensor::Of<int64_t>({n}, ids);
      HostTensor cu = CuTensor(part.cu_seqlens);
      HostTensor x_aligned = HostTensor::Zeros<int64_t>({part.total});
      HostTensor cu_padded =
          HostTensor::Zeros<int32_t>({static_cast<int64_t>(part.cu_seqlens.size())});
      HostTensor seqused =
          HostTensor::Zeros<int32_t>({static_cast<int64_t>(part.cu_seqlens.size()) - 1});
      ASSERT_TRUE(PackAligned(x.view(), {&cu.view(), {}}, align_to, part.total, kPad,
                              x_aligned.view(), cu_padded.view(), seqused.view(), nullptr)
                      .ok());
      EXPECT_EQ(cu_padded.values<int32_t>(), part.cu_seqlens_aligned);
      const std::vector<int64_t> packed = x_aligned.values<int64_t>();
      for (int64_t t = end; t < part.total; ++t) EXPECT_EQ(packed[t], kPad) << t;

      const Seqlens layout{&cu_padded.view(), part.cu_seqlens_aligned, part.total};
      HostTensor pos = HostTensor::Zeros<int64_t>({part.total});
      ASSERT_TRUE(PositionIds(layout, pos.view(), nullptr).ok());
      HostTensor labels = HostTensor::Zeros<int64_t>({part.total});
      ASSERT_TRUE(
          ShiftLabels(x_aligned.view(), {&cu.view(), {}}, &layout, -100, labels.view(), nullptr)
              .ok());
      const std::vector<int64_t> p = pos.values<int64_t>(), l = labels.values<int64_t>();
      for (int64_t t = end; t < part.total; ++t) {
        EXPECT_EQ(p[t], t - end) << t;
        EXPECT_EQ(l[t], -100) << t;
      }
    }
    EXPECT_GE(tails, 2) << "the lengths must give several micro-batches a tail";
  }
}

}  // namespace
}  // namespace packsched::kernels
