// The CUDA recurrent kernels' device code (kernels/cuda/recurrent_device.cuh) run on the CPU
// under the emulation of the CUDA execution model (cuda_emulation/cuda_runtime.h: one std::thread
// per CUDA thread, __syncthreads as a barrier, one block at a time), against the CPU backend
// (packsched/kernels/recurrent.h) on a packed row of two trees with branch points and a sequence
// start: the indexing, the per-column threads, the shared arrays, the barriers and the branch
// points' dS sums. It says nothing about the GPU toolchain or the hardware.

#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "cuda_runtime.h"  // the emulation (this target's include path puts it first)
#include "gtest/gtest.h"
#include "kernels/cuda/recurrent_device.cuh"
#include "packsched/kernels/recurrent.h"
#include "tests/kernels/host_tensor.h"
#include "tests/kernels/recurrent_rows.h"

namespace packsched::kernels::internal::cuda {
namespace {

using testing::HostTensor;
using testing::TwoTreeRows;
using testing::UniformValues;

// Runs `kernel()` for every thread of `blocks` blocks of kBlock threads.
template <typename Kernel>
void RunGrid(int blocks, Kernel kernel) {
  namespace emu = ::packsched_cuda_emulation;
  emu::grid_dim = dim3(blocks);
  for (int b = 0; b < blocks; ++b) {
    emu::block_idx = dim3(b);
    std::barrier<> barrier(kBlock);
    emu::block_barrier = &barrier;
    std::vector<std::thread> threads;
    for (int i = 0; i < kBlock; ++i) {
      threads.emplace_back([&kernel, i] {
        emu::thread_idx = dim3(i);
        kernel();
      });
    }
    for (std::thread& t : threads) t.join();
  }
  emu::block_barrier = nullptr;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-12 * std::max(1.0, std::abs(want[i])))
        << what << "[" << i << "]";
  }
}

class RecurrentEmulated : public ::testing::TestWithParam<bool> {};  // with beta or not

TEST_P(RecurrentEmulated, GatedRecurrenceEqualsTheCpuBackend) {
  const bool with_beta = GetParam();
  const std::vector<int32_t> prev = TwoTreeRows();
  const int64_t rows = 20, heads = 2;
  const int kd = 5, vd = 7;
  auto q = HostTensor::Of<double>({rows, heads, kd}, UniformValues(rows * heads * kd, 1, -1, 1));
  auto k =
      HostTensor::Of<double>({rows, heads, kd}, UniformValues(rows * heads * kd, 2, -0.6, 0.6));
  auto v = HostTensor::Of<double>({rows, heads, vd}, UniformValues(rows * heads * vd, 3, -1, 1));
  auto g = HostTensor::Of<double>({rows, heads}, UniformValues(rows * heads, 4, -1, 0));
  auto beta = HostTensor::Of<double>({rows, heads}, UniformValues(rows * heads, 5, 0, 1));
  auto d_out =
      HostTensor::Of<double>({rows, heads, vd}, UniformValues(rows * heads * vd, 6, -1, 1));
  auto prev_t = HostTensor::Of<int32_t>({rows}, prev);
  const DLTensor* b = with_beta ? &beta.view() : nullptr;

  auto out = HostTensor::Zeros<double>({rows, heads, vd});
  auto dq = HostTensor::Zeros<double>({rows, heads, kd});
  auto dk = HostTensor::Zeros<double>({rows, heads, kd});
  auto dv = HostTensor::Zeros<double>({rows, heads, vd});
  auto dg = HostTensor::Zeros<double>({rows, heads});
  auto db = HostTensor::Zeros<double>({rows, heads});
  ASSERT_TRUE(kernels::GatedRecurrenceForward(q.view(), k.view(), v.view(), g.view(), b,
                                              prev_t.view(), out.view(), nullptr)
                  .ok());
  ASSERT_TRUE(kernels::GatedRecurrenceBackward(
                  q.view(), k.view(), v.view(), g.view(), b, prev_t.view(), d_out.view(), dq.view(),
                  dk.view(), dv.view(), dg.view(), with_beta ? &db.view() : nullptr, nullptr)
                  .ok());

  RecurrenceArgs a{};
  a.dtype = FloatType::kF64;
  a.rows = rows;
  a.heads = heads;
  a.kd = kd;
  a.vd = vd;
  a.q = q.data<double>();
  a.k = k.data<double>();
  a.v = v.data<double>();
  a.g = g.data<double>();
  a.beta = with_beta ? beta.data<double>() : nullptr;
  a.prev_row = prev.data();
  std::vector<double> e_out(rows * heads * vd), e_dq(rows * heads * kd), e_dk(e_dq.size()),
      e_dv(e_out.size()), e_dg(rows * heads), e_db(rows * heads);
  a.out = e_out.data();
  a.d_out = d_out.data<double>();
  a.dq = e_dq.data();
  a.dk = e_dk.data();
  a.dv = e_dv.data();
  a.dg = e_dg.data();
  a.d_beta = with_beta ? e_db.data() : nullptr;
  std::vector<double> states(rows * heads * kd * vd), ds_acc(states.size(), 0.0);
  RunGrid(heads, [&] { RecurrenceForwardKernel<double>(a, states.data()); });
  RunGrid(heads, [&] { RecurrenceBackwardKernel<double>(a, states.data(), ds_acc.data()); });

  ExpectNear(e_out, out.values<double>(), "out");
  ExpectNear(e_dq, dq.values<double>(), "dq");
  ExpectNear(e_dk, dk.values<double>(), "dk");
  ExpectNear(e_dv, dv.values<double>(), "dv");
  ExpectNear(e_dg, dg.values<double>(), "dg");
  if (with_beta) ExpectNear(e_db, db.values<double>(), "d_beta");
}

INSTANTIATE_TEST_SUITE_P(Beta, RecurrentEmulated, ::testing::Bool());

TEST(RecurrentEmulatedConv, ConvolutionEqualsTheCpuBackend) {
  const std::vector<int32_t> prev = TwoTreeRows();
  const int64_t rows = 20, channels = 3;
  const int width = 4;
  auto x = HostTensor::Of<double>({rows, channels}, UniformValues(rows * channels, 7, -1, 1));
  auto w = HostTensor::Of<double>({channels, width}, UniformValues(channels * width, 8, -1, 1));
  auto bias = HostTensor::Of<double>({channels}, UniformValues(channels, 9, -1, 1));
  auto d_out = HostTensor::Of<double>({rows, channels}, UniformValues(rows * channels, 10, -1, 1));
  auto prev_t = HostTensor::Of<int32_t>({rows}, prev);
  auto out = HostTensor::Zeros<double>({rows, channels});
  auto dx = HostTensor::Zeros<double>({rows, channels});
  auto dw = HostTensor::Zeros<double>({channels, width});
  auto db = HostTensor::Zeros<double>({channels});
  ASSERT_TRUE(kernels::CausalConv1dForward(x.view(), w.view(), &bias.view(), prev_t.view(), true,
                                           out.view(), nullptr)
                  .ok());
  ASSERT_TRUE(kernels::CausalConv1dBackward(x.view(), w.view(), &bias.view(), prev_t.view(), true,
                                            d_out.view(), dx.view(), dw.view(), &db.view(), nullptr)
                  .ok());

  std::vector<double> e_out(rows * channels), e_dx(rows * channels), e_dw(channels * width),
      e_db(channels), dx_acc(rows * channels, 0.0);
  const double* xp = x.data<double>();
  const double* wp = w.data<double>();
  const double* bp = bias.data<double>();
  RunGrid(1, [&] {
    ConvForwardKernel<double>(xp, wp, bp, prev.data(), rows, channels, width, true, e_out.data());
  });
  RunGrid(1, [&] {
    ConvBackwardKernel<double>(xp, wp, bp, prev.data(), rows, channels, width, true,
                               d_out.data<double>(), dx_acc.data(), e_dx.data(), e_dw.data(),
                               e_db.data());
  });
  ExpectNear(e_out, out.values<double>(), "out");
  ExpectNear(e_dx, dx.values<double>(), "dx");
  ExpectNear(e_dw, dw.values<double>(), "d_weight");
  ExpectNear(e_db, db.values<double>(), "d_bias");
}

}  // namespace
}  // namespace packsched::kernels::internal::cuda
