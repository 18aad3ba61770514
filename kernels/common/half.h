#ifndef PACKSCHED_KERNELS_COMMON_HALF_H_
#define PACKSCHED_KERNELS_COMMON_HALF_H_

// IEEE binary16 (fp16) and bfloat16 storage types with float conversions that compile for host
// and device. The conversions are written with integer bit operations, not with CUDA intrinsics,
// so the CPU backend and the CUDA backend round identically (to nearest, ties to even; NaN stays
// a quiet NaN; overflow goes to infinity).

#include <cstdint>
#include <cstring>

#include "kernels/common/macros.h"

namespace packsched::kernels {

// 16-bit storage, layout-compatible with DLPack's float16 / bfloat16 elements.
struct Fp16 {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};

PACKSCHED_HD_INLINE uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

PACKSCHED_HD_INLINE float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// Rounds `f` to the nearest fp16 (ties to even).
PACKSCHED_HD_INLINE Fp16 FloatToFp16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf, or NaN (kept quiet)
    return Fp16{static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u))};
  }
  // 65520 is halfway between 65504 (largest fp16) and 65536; the tie goes to the even neighbour,
  // which is infinity.
  if (ax >= 0x477ff000u) return Fp16{static_cast<uint16_t>(sign | 0x7c00u)};
  if (ax < 0x38800000u) {  // below 2^-14: an fp16 subnormal or zero, in units of 2^-24
    if (ax <= 0x33000000u) return Fp16{static_cast<uint16_t>(sign)};  // <= 2^-25 rounds to 0
    const uint32_t exponent = ax >> 23;
    const uint32_t mantissa = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // value * 2^24 = mantissa >> shift
    uint32_t r = mantissa >> shift;
    const uint32_t rem = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return Fp16{static_cast<uint16_t>(sign | r)};
  }
  // Normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits; a carry out of the
  // mantissa correctly bumps the exponent.
  uint32_t r = (ax >> 13) - (112u << 10);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return Fp16{static_cast<uint16_t>(sign | r)};
}

// Exact.
PACKSCHED_HD_INLINE float Fp16ToFloat(Fp16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1fu;
  const uint32_t mantissa = h.bits & 0x3ffu;
  if (exponent == 0) {
    // Subnormal (or zero): mantissa * 2^-24, exact in float.
    const float v = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exponent == 31) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Rounds `f` to the nearest bfloat16 (ties to even).
PACKSCHED_HD_INLINE Bf16 FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((x >> 16) | 0x40u)};
  return Bf16{static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

// Exact.
PACKSCHED_HD_INLINE float Bf16ToFloat(Bf16 b) {
  return BitsToFloat(static_cast<uint32_t>(b.bits) << 16);
}

// Conversions between a storage type and its accumulation type (float for the 16-bit types,
// the type itself otherwise), so templated kernels read `ToAcc(x[i])` and `FromAcc<T>(v)`.
PACKSCHED_HD_INLINE float ToAcc(Fp16 v) { return Fp16ToFloat(v); }
PACKSCHED_HD_INLINE float ToAcc(Bf16 v) { return Bf16ToFloat(v); }
PACKSCHED_HD_INLINE float ToAcc(float v) { return v; }
PACKSCHED_HD_INLINE double ToAcc(double v) { return v; }

template <typename T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <typename T>
using Acc = typename AccOf<T>::type;

template <typename T>
PACKSCHED_HD_INLINE T FromAcc(Acc<T> v);
template <>
PACKSCHED_HD_INLINE Fp16 FromAcc<Fp16>(float v) {
  return FloatToFp16(v);
}
template <>
PACKSCHED_HD_INLINE Bf16 FromAcc<Bf16>(float v) {
  return FloatToBf16(v);
}
template <>
PACKSCHED_HD_INLINE float FromAcc<float>(float v) {
  return v;
}
template <>
PACKSCHED_HD_INLINE double FromAcc<double>(double v) {
  return v;
}

}  // namespace packsched::kernels

#endif  // PACKSCHED_KERNELS_COMMON_HALF_H_
