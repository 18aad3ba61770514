#ifndef PACKSCHED_TESTS_KERNELS_HOST_TENSOR_H_
#define PACKSCHED_TESTS_KERNELS_HOST_TENSOR_H_

// Test helpers: host tensors that own their storage and hand out DLTensor views, plus the
// packed-batch fixtures the kernel tests share.

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dlpack/dlpack.h"
#include "kernels/common/half.h"

namespace packsched::kernels::testing {

template <typename T>
DLDataType DTypeOf();
template <>
inline DLDataType DTypeOf<uint8_t>() {
  return {kDLUInt, 8, 1};
}
template <>
inline DLDataType DTypeOf<int8_t>() {
  return {kDLInt, 8, 1};
}
template <>
inline DLDataType DTypeOf<int16_t>() {
  return {kDLInt, 16, 1};
}
template <>
inline DLDataType DTypeOf<int32_t>() {
  return {kDLInt, 32, 1};
}
template <>
inline DLDataType DTypeOf<int64_t>() {
  return {kDLInt, 64, 1};
}
template <>
inline DLDataType DTypeOf<float>() {
  return {kDLFloat, 32, 1};
}
template <>
inline DLDataType DTypeOf<double>() {
  return {kDLFloat, 64, 1};
}
template <>
inline DLDataType DTypeOf<Fp16>() {
  return {kDLFloat, 16, 1};
}
template <>
inline DLDataType DTypeOf<Bf16>() {
  return {kDLBfloat, 16, 1};
}

// A dense row-major host tensor. view() stays valid while the tensor lives and is not resized.
class HostTensor {
 public:
  HostTensor(std::vector<int64_t> shape, DLDataType dtype) : shape_(std::move(shape)) {
    t_.dtype = dtype;
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    bytes_.assign(n * (dtype.bits / 8) + 1, 0);  // +1: data() is never null
    t_.data = bytes_.data();
    t_.device = {kDLCPU, 0};
    t_.ndim = static_cast<int32_t>(shape_.size());
    t_.shape = shape_.data();
    t_.strides = nullptr;
    t_.byte_offset = 0;
  }

  template <typename T>
  static HostTensor Of(std::vector<int64_t> shape, const std::vector<T>& values) {
    HostTensor t(std::move(shape), DTypeOf<T>());
    if (!values.empty()) std::memcpy(t.bytes_.data(), values.data(), values.size() * sizeof(T));
    return t;
  }

  template <typename T>
  static HostTensor Zeros(std::vector<int64_t> shape) {
    return HostTensor(std::move(shape), DTypeOf<T>());
  }

  const DLTensor& view() const { return t_; }
  DLTensor& mutable_view() { return t_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  int64_t nbytes() const { return numel() * (t_.dtype.bits / 8); }
  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(bytes_.data());
  }
  template <typename T>
  std::vector<T> values() const {
    std::vector<T> out(numel());
    if (!out.empty()) std::memcpy(out.data(), bytes_.data(), nbytes());
    return out;
  }
  // Raw bytes of the elements (for bit-exact comparisons).
  std::vector<uint8_t> bytes() const {
    return std::vector<uint8_t>(bytes_.begin(), bytes_.begin() + nbytes());
  }
  void FillRandomBytes(uint32_t seed) {
    std::mt19937 rng(seed);
    for (auto& b : bytes_) b = static_cast<uint8_t>(rng());
  }

 private:
  std::vector<int64_t> shape_;
  std::vector<uint8_t> bytes_;
  DLTensor t_{};
};

inline std::vector<int32_t> CuSeqlens(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + lengths[b];
  return cu;
}

inline HostTensor CuTensor(const std::vector<int32_t>& cu) {
  return HostTensor::Of<int32_t>({static_cast<int64_t>(cu.size())}, cu);
}

// The length sweeps every op is tested with: each length alone (batch 1), and all of them in one
// batch with zero-length sequences at both ends and in the middle.
inline std::vector<std::vector<int32_t>> LengthSweeps() {
  std::vector<std::vector<int32_t>> sweeps;
  for (int32_t len : {0, 1, 97, 128, 1025}) sweeps.push_back({len});
  sweeps.push_back({0, 1, 97, 0, 128, 1025, 0});
  sweeps.push_back({});  // B = 0
  return sweeps;
}

}  // namespace packsched::kernels::testing

#endif  // PACKSCHED_TESTS_KERNELS_HOST_TENSOR_H_
