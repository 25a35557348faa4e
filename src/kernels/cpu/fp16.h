// IEEE half precision conversions for the CPU kernels. With F16C (every x86-64-v3 CPU) the
// hardware converts; without it, the portable functions below compute the same bits:
// round to nearest even, overflow to inf, gradual underflow, NaN kept quiet with its
// payload's upper bits. A test checks them against F16C on every half and many floats.
#pragma once
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <bit>
#include <cstddef>
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

// The conversions the kernels call: F16C where the build targets it, eight at a time in
// the blocks; the portable functions above otherwise (the same bits).
#if defined(__F16C__)
inline constexpr int kFp16Nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
inline uint16_t fp16_bits(float f) { return _cvtss_sh(f, kFp16Nearest); }
inline float fp16_value(uint16_t h) { return _cvtsh_ss(h); }
#else
inline uint16_t fp16_bits(float f) { return fp16_bits_portable(f); }
inline float fp16_value(uint16_t h) { return fp16_value_portable(h); }
#endif

// Rounds x[0, n) into out[0, n).
inline void round_block_to_fp16(const float* x, uint16_t* out, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), kFp16Nearest));
#endif
  for (; i < n; i++) out[i] = fp16_bits(x[i]);
}

// Widens x[0, n) into out[0, n) (exact).
inline void widen_block_from_fp16(const uint16_t* x, float* out, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + i))));
#endif
  for (; i < n; i++) out[i] = fp16_value(x[i]);
}

}  // namespace meshtrain::kernels
