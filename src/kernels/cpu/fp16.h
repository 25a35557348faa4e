// IEEE half precision conversions for the CPU kernels. With F16C (every x86-64-v3 CPU) the
// hardware converts; without it, the portable functions below compute the same bits:
// round to nearest even, overflow to inf, gradual underflow, NaN kept quiet with its
// payload's upper bits. A test checks them against F16C on every half and many floats.
#pragma once
#include <bit>
#include <cstdint>

namespace meshtrain::kernels {

inline uint16_t fp16_bits_portable(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00u | (uint16_t)((ax >> 13) & 0x3FFu);  // NaN
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 (half-way past 65504): inf
  if (ax < 0x38800000u) {
    // Below 2^-14 the half is subnormal: a whole number of 2^-24 steps. Adding 0.5, whose
    // fp32 ulp is 2^-24, makes the FPU round |f| to that grid (nearest even); the step count
    // is then the sum's mantissa.
    const float sum = std::bit_cast<float>(ax) + 0.5f;
    return sign | (uint16_t)(std::bit_cast<uint32_t>(sum) - 0x3F000000u);
  }
  // Normal: re-bias the exponent (127 -> 15), then drop 13 mantissa bits, rounding to
  // nearest even; a carry out of the mantissa correctly bumps the exponent.
  uint32_t r = ax - (112u << 23);
  r += 0xFFFu + ((r >> 13) & 1u);
  return sign | (uint16_t)(r >> 13);
}

inline float fp16_value_portable(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float v = (float)mantissa * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exponent == 31)  // inf, or NaN made quiet
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace meshtrain::kernels
