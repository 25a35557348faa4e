// 1-bit compression's element loops: the sign bits with error feedback and their
// decompression (compress/onebit.cc computes the scale between them). Each byte holds 8
// values and is written by one thread, so the threads change nothing.
#include <algorithm>
#include <cstdint>

#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {
// Below this many values a parallel region costs more than the loop.
constexpr size_t kOneBitParallel = 1 << 16;
}  // namespace

void add_inplace(float* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n >= kOneBitParallel)
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void onebit_pack(float* error, size_t n, float scale, uint8_t* signs) {
  const size_t bytes = (n + 7) / 8;
#pragma omp parallel for schedule(static) if (n >= kOneBitParallel)
  for (size_t b = 0; b < bytes; b++) {
    uint8_t bits = 0;
    const size_t end = std::min(n, 8 * b + 8);
    for (size_t i = 8 * b; i < end; i++) {
      const bool positive = error[i] >= 0.f;
      bits |= (uint8_t)(positive ? 1u : 0u) << (i % 8);
      error[i] -= positive ? scale : -scale;
    }
    signs[b] = bits;
  }
}

void onebit_unpack(const uint8_t* signs, size_t n, float scale, float* out, bool accumulate) {
  // A byte's 8 values at a time, branch-free (bit k set: +scale), so the inner loop vectorises.
  const size_t whole = n / 8;
#pragma omp parallel for schedule(static) if (n >= kOneBitParallel)
  for (size_t b = 0; b < whole; b++) {
    const unsigned bits = signs[b];
    float* o = out + 8 * b;
    if (accumulate) {
      for (int k = 0; k < 8; k++) o[k] += scale * (float)(int)(((bits >> k) & 1u) * 2u - 1u);
    } else {
      for (int k = 0; k < 8; k++) o[k] = scale * (float)(int)(((bits >> k) & 1u) * 2u - 1u);
    }
  }
  for (size_t i = 8 * whole; i < n; i++) {
    const float v = (signs[i / 8] >> (i % 8)) & 1u ? scale : -scale;
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace meshtrain::kernels
