#ifndef PACKSCHED_TESTS_KERNELS_DEVICE_TENSOR_H_
#define PACKSCHED_TESTS_KERNELS_DEVICE_TENSOR_H_

// CUDA test helpers shared by kernels_cuda_test and kernels_attention_cuda_test: whether a device
// is usable, and device copies of host tensors that can be read back.

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "dlpack/dlpack.h"
#include "gtest/gtest.h"
#include "tests/kernels/host_tensor.h"

namespace packsched::kernels::testing {

// cudaGetDeviceCount fails (not just returns 0) on a machine without a driver: both mean no GPU.
inline bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// A device copy of a host tensor, same shape and dtype.
class DeviceTensor {
 public:
  explicit DeviceTensor(const HostTensor& host) : view_(host.view()), bytes_(host.nbytes()) {
    shape_.assign(view_.shape, view_.shape + view_.ndim);
    view_.shape = shape_.data();
    EXPECT_EQ(cudaMalloc(&view_.data, bytes_ + 16), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(view_.data, host.view().data, bytes_, cudaMemcpyHostToDevice),
              cudaSuccess);
    view_.device = {kDLCUDA, 0};
  }
  ~DeviceTensor() { cudaFree(view_.data); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  const DLTensor& view() const { return view_; }
  // The device bytes, copied back.
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out(bytes_);
    EXPECT_EQ(cudaMemcpy(out.data(), view_.data, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  // The device bytes, copied back into `host` (same shape and dtype as the source).
  void CopyTo(HostTensor& host) const {
    EXPECT_EQ(cudaMemcpy(host.data<uint8_t>(), view_.data, bytes_, cudaMemcpyDeviceToHost),
              cudaSuccess);
  }

 private:
  DLTensor view_;
  std::vector<int64_t> shape_;
  int64_t bytes_;
};

}  // namespace packsched::kernels::testing

#endif  // PACKSCHED_TESTS_KERNELS_DEVICE_TENSOR_H_
