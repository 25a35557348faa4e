// Conversions between fp32 and the 16-bit formats: bfloat16 (the upper half of an fp32,
// rounded to nearest even) and IEEE half (nearest even, overflow to inf, gradual underflow;
// F16C where the build targets it, kernels/cpu/fp16.h's portable conversions otherwise).
// Used for GEMM operands and for half-precision parameter and gradient storage.
#include <omp.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/profile.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/fp16.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {

// Calls convert(begin, end) on blocks of [0, n), over the threads when n is large (a
// conversion inside another parallel region stays on its thread). `bytes_each`: what one
// element reads and writes, for the step profile.
template <typename Convert>
void in_blocks(size_t n, double bytes_each, Convert convert) {
  constexpr size_t kBlock = 4096;
  // (Inside another parallel region, the optimizer's, a conversion is that op's work.)
  std::optional<profile::Scope> scope;
  if (!omp_in_parallel()) scope.emplace(profile::Op::kConvert, 0, bytes_each * (double)n);
#pragma omp parallel for schedule(static) if (n >= 4 * kBlock && !omp_in_parallel())
  for (size_t b = 0; b < n; b += kBlock) convert(b, std::min(n, b + kBlock));
}

void bf16_block(const float* x, uint16_t* out, size_t b, size_t e) {
  round_block_to_bf16(x + b, out + b, e - b);
}

void fp16_block(const float* x, uint16_t* out, size_t b, size_t e) { round_block_to_fp16(x + b, out + b, e - b); }

void from_fp16_block(const uint16_t* x, float* out, size_t b, size_t e) {
  widen_block_from_fp16(x + b, out + b, e - b);
}

void from_bf16_block(const uint16_t* x, float* out, size_t b, size_t e) {
  widen_block_from_bf16(x + b, out + b, e - b);
}

}  // namespace

void to_bf16(const float* x, uint16_t* out, size_t n) {
  in_blocks(n, 6, [&](size_t b, size_t e) { bf16_block(x, out, b, e); });
}

void from_bf16(const uint16_t* x, float* out, size_t n) {
  in_blocks(n, 6, [&](size_t b, size_t e) { from_bf16_block(x, out, b, e); });
}

void round_to_fp16(const float* x, float* out, size_t n) {
  in_blocks(n, 8, [&](size_t b, size_t e) {
    size_t i = b;
#if defined(__F16C__)
    for (; i + 8 <= e; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), kFp16Nearest)));
#endif
    for (; i < e; i++) out[i] = fp16_value(fp16_bits(x[i]));
  });
}

void to_half(Precision p, const float* x, uint16_t* out, size_t n) {
  if (p == Precision::kBf16)
    in_blocks(n, 6, [&](size_t b, size_t e) { bf16_block(x, out, b, e); });
  else
    in_blocks(n, 6, [&](size_t b, size_t e) { fp16_block(x, out, b, e); });
}

void from_half(Precision p, const uint16_t* x, float* out, size_t n) {
  if (p == Precision::kBf16)
    in_blocks(n, 6, [&](size_t b, size_t e) { from_bf16_block(x, out, b, e); });
  else
    in_blocks(n, 6, [&](size_t b, size_t e) { from_fp16_block(x, out, b, e); });
}

void add_to_half(Precision p, uint16_t* dst, const float* src, size_t n) {
  in_blocks(n, 8, [&](size_t b, size_t e) {
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
