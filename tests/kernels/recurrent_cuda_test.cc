// The CUDA backend of the recurrent kernels (recurrent.h) against the CPU backend on a packed row
// of two trees (branch points and a sequence start), float64: outputs and every gradient within
// 1e-12 (both accumulate in double; the block reductions add in another order). Skips without a
// device.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "packsched/kernels/recurrent.h"
#include "tests/kernels/device_tensor.h"
#include "tests/kernels/host_tensor.h"
#include "tests/kernels/recurrent_rows.h"

namespace packsched::kernels {
namespace {

using testing::DeviceTensor;
using testing::HaveDevice;
using testing::HostTensor;
using testing::TwoTreeRows;
using testing::UniformValues;

class RecurrentCudaConvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  }
};

// With beta (the gated delta rule) or not.
class RecurrentCudaTest : public RecurrentCudaConvTest,
                          public ::testing::WithParamInterface<bool> {};

void ExpectClose(const DeviceTensor& device, HostTensor& scratch, const HostTensor& cpu,
                 const char* what) {
  device.CopyTo(scratch);
  const std::vector<double> got = scratch.values<double>(), want = cpu.values<double>();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-12 * std::max(1.0, std::abs(want[i])))
        << what << "[" << i << "]";
  }
}

TEST_P(RecurrentCudaTest, GatedRecurrenceMatchesTheCpu) {
  const bool with_beta = GetParam();
  const int64_t rows = 20, heads = 3, kd = 6, vd = 5;
  HostTensor q =
      HostTensor::Of<double>({rows, heads, kd}, UniformValues(rows * heads * kd, 1, -1, 1));
  HostTensor k =
      HostTensor::Of<double>({rows, heads, kd}, UniformValues(rows * heads * kd, 2, -1, 1));
  HostTensor v =
      HostTensor::Of<double>({rows, heads, vd}, UniformValues(rows * heads * vd, 3, -1, 1));
  HostTensor g = HostTensor::Of<double>({rows, heads}, UniformValues(rows * heads, 4, -1, 0));
  HostTensor b = HostTensor::Of<double>({rows, heads}, UniformValues(rows * heads, 5, 0, 1));
  HostTensor d_out =
      HostTensor::Of<double>({rows, heads, vd}, UniformValues(rows * heads * vd, 6, -1, 1));
  HostTensor prev = HostTensor::Of<int32_t>({rows}, TwoTreeRows());
  HostTensor out = HostTensor::Zeros<double>({rows, heads, vd});
  HostTensor dq = HostTensor::Zeros<double>({rows, heads, kd});
  HostTensor dk = HostTensor::Zeros<double>({rows, heads, kd});
  HostTensor dv = HostTensor::Zeros<double>({rows, heads, vd});
  HostTensor dg = HostTensor::Zeros<double>({rows, heads});
  HostTensor db = HostTensor::Zeros<double>({rows, heads});
  const DLTensor* beta = with_beta ? &b.view() : nullptr;
  ASSERT_TRUE(GatedRecurrenceForward(q.view(), k.view(), v.view(), g.view(), beta, prev.view(),
                                     out.view(), nullptr)
                  .ok());
  ASSERT_TRUE(GatedRecurrenceBackward(q.view(), k.view(), v.view(), g.view(), beta, prev.view(),
                                      d_out.view(), dq.view(), dk.view(), dv.view(), dg.view(),
                                      with_beta ? &db.view() : nullptr, nullptr)
                  .ok());

  DeviceTensor q_d(q), k_d(k), v_d(v), g_d(g), b_d(b), d_out_d(d_out), prev_d(prev), out_d(out),
      dq_d(dq), dk_d(dk), dv_d(dv), dg_d(dg), db_d(db);
  const DLTensor* beta_d = with_beta ? &b_d.view() : nullptr;
  absl::Status s = GatedRecurrenceForward(q_d.view(), k_d.view(), v_d.view(), g_d.view(), beta_d,
                                          prev_d.view(), out_d.view(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  s = GatedRecurrenceBackward(q_d.view(), k_d.view(), v_d.view(), g_d.view(), beta_d, prev_d.view(),
                              d_out_d.view(), dq_d.view(), dk_d.view(), dv_d.view(), dg_d.view(),
                              with_beta ? &db_d.view() : nullptr, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor scratch_v = HostTensor::Zeros<double>({rows, heads, vd});
  HostTensor scratch_k = HostTensor::Zeros<double>({rows, heads, kd});
  HostTensor scratch_h = HostTensor::Zeros<double>({rows, heads});
  ExpectClose(out_d, scratch_v, out, "out");
  ExpectClose(dq_d, scratch_k, dq, "dq");
  ExpectClose(dk_d, scratch_k, dk, "dk");
  ExpectClose(dv_d, scratch_v, dv, "dv");
  ExpectClose(dg_d, scratch_h, dg, "dg");
  if (with_beta) ExpectClose(db_d, scratch_h, db, "d_beta");
}

INSTANTIATE_TEST_SUITE_P(Beta, RecurrentCudaTest, ::testing::Bool());

TEST_F(RecurrentCudaConvTest, ConvolutionMatchesTheCpu) {
  const int64_t rows = 20, channels = 7, width = 4;
  HostTensor x = HostTensor::Of<double>({rows, channels}, UniformValues(rows * channels, 7, -1, 1));
  HostTensor w =
      HostTensor::Of<double>({channels, width}, UniformValues(channels * width, 8, -1, 1));
  HostTensor bias = HostTensor::Of<double>({channels}, UniformValues(channels, 9, -1, 1));
  HostTensor d_out =
      HostTensor::Of<double>({rows, channels}, UniformValues(rows * channels, 10, -1, 1));
  HostTensor prev = HostTensor::Of<int32_t>({rows}, TwoTreeRows());
  HostTensor out = HostTensor::Zeros<double>({rows, channels});
  HostTensor dx = HostTensor::Zeros<double>({rows, channels});
  HostTensor dw = HostTensor::Zeros<double>({channels, width});
  HostTensor db = HostTensor::Zeros<double>({channels});
  ASSERT_TRUE(
      CausalConv1dForward(x.view(), w.view(), &bias.view(), prev.view(), true, out.view(), nullptr)
          .ok());
  ASSERT_TRUE(CausalConv1dBackward(x.view(), w.view(), &bias.view(), prev.view(), true,
                                   d_out.view(), dx.view(), dw.view(), &db.view(), nullptr)
                  .ok());
  DeviceTensor x_d(x), w_d(w), bias_d(bias), d_out_d(d_out), prev_d(prev), out_d(out), dx_d(dx),
      dw_d(dw), db_d(db);
  absl::Status s = CausalConv1dForward(x_d.view(), w_d.view(), &bias_d.view(), prev_d.view(), true,
                                       out_d.view(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  s = CausalConv1dBackward(x_d.view(), w_d.view(), &bias_d.view(), prev_d.view(), true,
                           d_out_d.view(), dx_d.view(), dw_d.view(), &db_d.view(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor scratch = HostTensor::Zeros<double>({rows, channels});
  HostTensor scratch_w = HostTensor::Zeros<double>({channels, width});
  HostTensor scratch_c = HostTensor::Zeros<double>({channels});
  ExpectClose(out_d, scratch, out, "out");
  ExpectClose(dx_d, scratch, dx, "dx");
  ExpectClose(dw_d, scratch_w, dw, "d_weight");
  ExpectClose(db_d, scratch_c, db, "d_bias");
}

}  // namespace
}  // namespace packsched::kernels
