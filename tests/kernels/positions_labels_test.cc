// PositionIds and ShiftLabels on the CPU backend, packed and aligned layouts.

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

TEST(PositionIdsTest, CountsFromZeroInsideEachSequence) {
  for (const auto& lengths : testing::LengthSweeps()) {
    const std::vector<int32_t> cu = CuSeqlens(lengths);
    HostTensor cu_t = CuTensor(cu);
    HostTensor pos = HostTensor::Zeros<int64_t>({cu.back()});
    ASSERT_TRUE(PositionIds({&cu_t.view(), {}}, pos.view(), nullptr).ok());
    std::vector<int64_t> want;
    for (int32_t len : lengths) {
      for (int32_t i = 0; i < len; ++i) want.push_back(i);
    }
    EXPECT_EQ(pos.values<int64_t>(), want);
  }
}

TEST(PositionIdsTest, PadSlotsOfTheAlignedLayoutContinueTheCount) {
  HostTensor cu_padded = CuTensor({0, 4, 4, 8});  // real lengths 3, 0, 1 aligned to 4
  HostTensor pos = HostTensor::Zeros<int64_t>({8});
  ASSERT_TRUE(PositionIds({&cu_padded.view(), {}}, pos.view(), nullptr).ok());
  EXPECT_EQ(pos.values<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3}));
}

// The align_total_to tail (Seqlens::rows past cu[B]) counts from 0 again, like verl's Ulysses
// padding; B = 0 with a tail is all tail.
TEST(PositionIdsTest, TheTailRestartsAtZero) {
  HostTensor cu_padded = CuTensor({0, 4, 8});
  HostTensor pos = HostTensor::Zeros<int64_t>({11});
  ASSERT_TRUE(PositionIds({&cu_padded.view(), {}, 11}, pos.view(), nullptr).ok());
  EXPECT_EQ(pos.values<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2}));
  HostTensor empty = CuTensor({0});
  HostTensor only_tail = HostTensor::Zeros<int64_t>({3});
  ASSERT_TRUE(PositionIds({&empty.view(), {}, 3}, only_tail.view(), nullptr).ok());
  EXPECT_EQ(only_tail.values<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
}

TEST(PositionIdsTest, RowsBelowTheOffsetsAreRejected) {
  HostTensor cu = CuTensor({0, 4});
  HostTensor pos = HostTensor::Zeros<int64_t>({4});
  const absl::Status s = PositionIds({&cu.view(), {}, 3}, pos.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rows = 3 must be -1 (no tail) or at least cu_seqlens[B] = 4"),
            absl::string_view::npos)
      << s;
  // Without a declared tail the rows must match exactly, as before.
  HostTensor longer = HostTensor::Zeros<int64_t>({6});
  EXPECT_EQ(PositionIds({&cu.view(), {}}, longer.view(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

template <typename Id>
std::vector<Id> ReferenceLabels(const std::vector<Id>& ids, const std::vector<int32_t>& cu,
                                const std::vector<int32_t>& layout, Id ignore) {
  std::vector<Id> labels(ids.size(), ignore);
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int32_t len = cu[b + 1] - cu[b];
    for (int32_t i = 0; i + 1 < len; ++i) labels[layout[b] + i] = ids[layout[b] + i + 1];
  }
  return labels;
}

template <typename Id>
class ShiftLabelsTest : public ::testing::Test {};
using IdTypes = ::testing::Types<int32_t, int64_t>;
TYPED_TEST_SUITE(ShiftLabelsTest, IdTypes);

TYPED_TEST(ShiftLabelsTest, NeverCrossesABoundaryAndIgnoresPads) {
  std::mt19937 rng(1);
  for (const auto& lengths : testing::LengthSweeps()) {
    for (int64_t align : {0, 1, 16}) {  // 0: the packed layout
      SCOPED_TRACE(::testing::Message() << "B=" << lengths.size() << " align=" << align);
      const std::vector<int32_t> cu = CuSeqlens(lengths);
      const std::vector<int32_t> layout = align == 0 ? cu : *AlignedCuSeqlens(cu, align);
      std::vector<TypeParam> ids(layout.back());
      for (auto& id : ids) id = static_cast<TypeParam>(rng() % 50000);
      HostTensor ids_t = HostTensor::Of<TypeParam>({layout.back()}, ids);
      HostTensor cu_t = CuTensor(cu);
      HostTensor layout_t = CuTensor(layout);
      const Seqlens padded{&layout_t.view(), {}};
      HostTensor labels = HostTensor::Zeros<TypeParam>({layout.back()});
      ASSERT_TRUE(ShiftLabels(ids_t.view(), {&cu_t.view(), {}}, align == 0 ? nullptr : &padded,
                              -100, labels.view(), nullptr)
                      .ok());
      EXPECT_EQ(labels.template values<TypeParam>(),
                ReferenceLabels<TypeParam>(ids, cu, layout, -100));
    }
  }
}

TEST(ShiftLabelsTest, SmallExampleReadsLikeTheContract) {
  HostTensor ids = HostTensor::Of<int64_t>({5}, {1, 2, 3, 4, 5});
  HostTensor cu = CuTensor({0, 3, 3, 5});
  HostTensor labels = HostTensor::Zeros<int64_t>({5});
  ASSERT_TRUE(ShiftLabels(ids.view(), {&cu.view(), {}}, nullptr, -1, labels.view(), nullptr).ok());
  EXPECT_EQ(labels.values<int64_t>(), (std::vector<int64_t>{2, 3, -1, 5, -1}));
}

// Tail rows are ignore_index in both layouts, and the last real token before the tail does not
// take the tail's first id as its label.
TEST(ShiftLabelsTest, TheTailIsIgnored) {
  HostTensor ids = HostTensor::Of<int64_t>({8}, {1, 2, 3, 9, 4, 5, 9, 9});
  HostTensor cu = CuTensor({0, 3, 5});
  HostTensor cu_padded = CuTensor({0, 4, 6});  // aligned to 2; rows 6 and 7 are the tail
  const Seqlens padded{&cu_padded.view(), {}, 8};
  HostTensor labels = HostTensor::Zeros<int64_t>({8});
  ASSERT_TRUE(
      ShiftLabels(ids.view(), {&cu.view(), {}}, &padded, -100, labels.view(), nullptr).ok());
  EXPECT_EQ(labels.values<int64_t>(),
            (std::vector<int64_t>{2, 3, -100, -100, 5, -100, -100, -100}));

  HostTensor packed_ids = HostTensor::Of<int32_t>({4}, {1, 2, 3, 0});
  HostTensor packed_cu = CuTensor({0, 3});
  HostTensor packed_labels = HostTensor::Zeros<int32_t>({4});
  ASSERT_TRUE(ShiftLabels(packed_ids.view(), {&packed_cu.view(), {}, 4}, nullptr, -100,
                          packed_labels.view(), nullptr)
                  .ok());
  EXPECT_EQ(packed_labels.values<int32_t>(), (std::vector<int32_t>{2, 3, -100, -100}));
}

TEST(ShiftLabelsTest, RejectsAnIgnoreIndexThatInt32IdsCannotHold) {
  HostTensor ids = HostTensor::Zeros<int32_t>({1});
  HostTensor cu = CuTensor({0, 1});
  HostTensor labels = HostTensor::Zeros<int32_t>({1});
  const absl::Status s =
      ShiftLabels(ids.view(), {&cu.view(), {}}, nullptr, int64_t{1} << 40, labels.view(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ignore_index"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace packsched::kernels
