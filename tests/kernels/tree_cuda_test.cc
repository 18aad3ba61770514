// The CUDA backend of the tree-packing kernels (tree.h) against the CPU backend: depths (equal),
// the multi-target cross entropy and its gradient (within float rounding). Skips without a device.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "packsched/kernels/tree.h"
#include "tests/kernels/device_tensor.h"
#include "tests/kernels/host_tensor.h"
#include "tests/kernels/tree_forest.h"

namespace packsched::kernels {
namespace {

using testing::CuTensor;
using testing::DeviceTensor;
using testing::HaveDevice;
using testing::HostTensor;

class TreeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(TreeCudaTest, PositionIdsMatchTheCpu) {
  const testing::PackedForest f = testing::RandomForest(5, 6, 20, 40);
  std::vector<int32_t> ends = f.subtree_end;
  ends.insert(ends.end(), 5, 0);  // a tail
  const int64_t rows = static_cast<int64_t>(ends.size());
  HostTensor cu = CuTensor(f.cu);
  HostTensor se = HostTensor::Of<int32_t>({rows}, ends);
  HostTensor cpu = HostTensor::Zeros<int64_t>({rows});
  HostTensor gpu = HostTensor::Zeros<int64_t>({rows});
  ASSERT_TRUE(TreePositionIds({&cu.view(), {}, rows}, se.view(), cpu.view(), nullptr).ok());
  DeviceTensor d_cu(cu), d_se(se), d_out(gpu);
  const absl::Status s =
      TreePositionIds({&d_cu.view(), f.cu, rows}, d_se.view(), d_out.view(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  d_out.CopyTo(gpu);
  EXPECT_EQ(gpu.values<int64_t>(), cpu.values<int64_t>());
}

TEST_F(TreeCudaTest, MultiTargetCrossEntropyMatchesTheCpu) {
  const int64_t num_rows = 37, vocab = 1000;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> logits(num_rows * vocab);
  for (float& x : logits) x = normal(rng);
  std::vector<int64_t> rows, labels;
  std::vector<float> upstream;
  for (int64_t r = 0; r < num_rows; r += 1 + r % 3) {  // some rows without targets
    for (int64_t i = 0; i <= r % 4; ++i) {             // up to 4 targets per row
      rows.push_back(r);
      labels.push_back((r * 131 + i * 17) % vocab);
      upstream.push_back(normal(rng));
    }
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  HostTensor lg = HostTensor::Of<float>({num_rows, vocab}, logits);
  HostTensor tr = HostTensor::Of<int64_t>({n}, rows), tl = HostTensor::Of<int64_t>({n}, labels);
  HostTensor dl = HostTensor::Of<float>({n}, upstream);
  HostTensor loss_c = HostTensor::Zeros<float>({n}), lse_c = HostTensor::Zeros<float>({num_rows});
  HostTensor grad_c = HostTensor::Zeros<float>({num_rows, vocab});
  ASSERT_TRUE(
      MultiTargetCrossEntropy(lg.view(), tr.view(), tl.view(), loss_c.view(), lse_c.view(), nullptr)
          .ok());
  ASSERT_TRUE(MultiTargetCrossEntropyBackward(lg.view(), lse_c.view(), tr.view(), tl.view(),
                                              dl.view(), grad_c.view(), nullptr)
                  .ok());
  HostTensor loss_g = HostTensor::Zeros<float>({n}), lse_g = HostTensor::Zeros<float>({num_rows});
  HostTensor grad_g = HostTensor::Zeros<float>({num_rows, vocab});
  DeviceTensor d_lg(lg), d_tr(tr), d_tl(tl), d_dl(dl), d_loss(loss_g), d_lse(lse_g), d_grad(grad_g);
  ASSERT_TRUE(MultiTargetCrossEntropy(d_lg.view(), d_tr.view(), d_tl.view(), d_loss.view(),
                                      d_lse.view(), nullptr)
                  .ok());
  ASSERT_TRUE(MultiTargetCrossEntropyBackward(d_lg.view(), d_lse.view(), d_tr.view(), d_tl.view(),
                                              d_dl.view(), d_grad.view(), nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  d_loss.CopyTo(loss_g);
  d_lse.CopyTo(lse_g);
  d_grad.CopyTo(grad_g);
  auto near = [](const std::vector<float>& a, const std::vector<float>& b, float tol) {
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol) << i;
  };
  near(lse_g.values<float>(), lse_c.values<float>(), 1e-4f);
  near(loss_g.values<float>(), loss_c.values<float>(), 1e-4f);
  near(grad_g.values<float>(), grad_c.values<float>(), 1e-5f);
}

}  // namespace
}  // namespace packsched::kernels
