// Conversions between fp32 and the 16-bit formats: bfloat16 (the upper half of an fp32,
// rounded to nearest even) and IEEE half (F16C: nearest even, overflow to inf, gradual
// underflow). Used for GEMM operands and for half-precision parameter and gradient storage.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {

constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

uint16_t round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return (uint16_t)(u >> 16);
}

float bf16_value(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Calls convert(begin, end) on blocks of [0, n), over the threads when n is large (a
// conversion inside another parallel region stays on its thread).
template <typename Convert>
void in_blocks(size_t n, Convert convert) {
  constexpr size_t kBlock = 4096;
#pragma omp parallel for schedule(static) if (n >= 4 * kBlock && !omp_in_parallel())
  for (size_t b = 0; b < n; b += kBlock) convert(b, std::min(n, b + kBlock));
}

void bf16_block(const float* x, uint16_t* out, size_t b, size_t e) {
  size_t i = b;
#if defined(__AVX512BF16__)
  // The hardware conversion rounds to nearest even as round_to_bf16 does.
  for (; i + 16 <= e; i += 16)
    _mm256_storeu_si256((__m256i*)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
#endif
  for (; i < e; i++) out[i] = round_to_bf16(x[i]);
}

void fp16_block(const float* x, uint16_t* out, size_t b, size_t e) {
  size_t i = b;
  for (; i + 8 <= e; i += 8)
    _mm_storeu_si128((__m128i*)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), kNearest));
  for (; i < e; i++) out[i] = _cvtss_sh(x[i], kNearest);
}

void from_fp16_block(const uint16_t* x, float* out, size_t b, size_t e) {
  size_t i = b;
  for (; i + 8 <= e; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + i))));
  for (; i < e; i++) out[i] = _cvtsh_ss(x[i]);
}

void from_bf16_block(const uint16_t* x, float* out, size_t b, size_t e) {
  for (size_t i = b; i < e; i++) out[i] = bf16_value(x[i]);
}

}  // namespace

void to_bf16(const float* x, uint16_t* out, size_t n) {
  in_blocks(n, [&](size_t b, size_t e) { bf16_block(x, out, b, e); });
}

void from_bf16(const uint16_t* x, float* out, size_t n) {
  in_blocks(n, [&](size_t b, size_t e) { from_bf16_block(x, out, b, e); });
}

void round_to_fp16(const float* x, float* out, size_t n) {
  in_blocks(n, [&](size_t b, size_t e) {
    size_t i = b;
    for (; i + 8 <= e; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), kNearest)));
    for (; i < e; i++) out[i] = _cvtsh_ss(_cvtss_sh(x[i], kNearest));
  });
}

void to_half(Precision p, const float* x, uint16_t* out, size_t n) {
  if (p == Precision::kBf16)
    in_blocks(n, [&](size_t b, size_t e) { bf16_block(x, out, b, e); });
  else
    in_blocks(n, [&](size_t b, size_t e) { fp16_block(x, out, b, e); });
}

void from_half(Precision p, const uint16_t* x, float* out, size_t n) {
  if (p == Precision::kBf16)
    in_blocks(n, [&](size_t b, size_t e) { from_bf16_block(x, out, b, e); });
  else
    in_blocks(n, [&](size_t b, size_t e) { from_fp16_block(x, out, b, e); });
}

void add_to_half(Precision p, uint16_t* dst, const float* src, size_t n) {
  in_blocks(n, [&](size_t b, size_t e) {
    float sum[4096];
    if (p == Precision::kBf16) from_bf16_block(dst + b, sum, 0, e - b);
    else from_fp16_block(dst + b, sum, 0, e - b);
#pragma omp simd
    for (size_t i = 0; i < e - b; i++) sum[i] += src[b + i];
    if (p == Precision::kBf16) bf16_block(sum, dst + b, 0, e - b);
    else fp16_block(sum, dst + b, 0, e - b);
  });
}

}  // namespace meshtrain::kernels
