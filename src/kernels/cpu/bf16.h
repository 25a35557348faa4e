// bfloat16 conversions for the CPU kernels: a bf16 value is the upper half of an fp32,
// rounded to nearest even. Inline so that kernels convert inside their own loops (the
// to_bf16 entry in ops.h splits large arrays over the threads).
#pragma once
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include <bit>
#include <cstdint>
#include <cstring>

namespace meshtrain::kernels {

inline uint16_t round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return (uint16_t)(u >> 16);
}

inline float bf16_value(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounds x[0, n) into out[0, n).
inline void round_block_to_bf16(const float* x, uint16_t* out, size_t n) {
  size_t i = 0;
#if defined(__AVX512BF16__)
  // The hardware conversion rounds to nearest even as round_to_bf16 does.
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i*)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
#endif
  for (; i < n; i++) out[i] = round_to_bf16(x[i]);
}

// Widens x[0, n) into out[0, n) (exact). A shift per element, which GCC vectorises.
inline void widen_block_from_bf16(const uint16_t* x, float* out, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) out[i] = std::bit_cast<float>((uint32_t)x[i] << 16);
}

}  // namespace meshtrain::kernels
