// The AdamW element updates (optim/adamw.cc drives them over its segments and chunks).
// Element-wise with no reduction, so neither the blocks nor the vector width change a value.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {

// Calls update(begin, end) on blocks of [0, n), over the threads when n is large; inside
// another parallel region (a caller that already splits its work) it stays on its thread.
constexpr size_t kAdamBlock = 2048;
template <typename Update>
void adam_blocks(size_t n, Update update) {
#pragma omp parallel for schedule(static) if (n >= 4 * kAdamBlock && !omp_in_parallel())
  for (size_t b = 0; b < n; b += kAdamBlock) update(b, std::min(n, b + kAdamBlock));
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWScalars& s) {
  adam_blocks(n, [&](size_t b, size_t e) {
    const float decay = s.decay, b1 = s.b1, b2 = s.b2, eps = s.eps, step_size = s.step_size,
                bias2_sqrt = s.bias2_sqrt;
#pragma omp simd
    for (size_t i = b; i < e; i++) {
      float pi = p[i] * decay;
      m[i] = m[i] + (g[i] - m[i]) * (1.0f - b1);
      v[i] = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
      float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
      p[i] = pi - step_size * m[i] / denom;
    }
  });
}

void scale_inplace(float* x, size_t n, float factor) {
  adam_blocks(n, [&](size_t b, size_t e) {
#pragma omp simd
    for (size_t i = b; i < e; i++) x[i] *= factor;
  });
}

void adamw_preconditioned_update(float* p, const float* u, size_t n, float decay, float step_size) {
  adam_blocks(n, [&](size_t b, size_t e) {
#pragma omp simd
    for (size_t i = b; i < e; i++) p[i] = p[i] * decay - step_size * u[i];
  });
}

}  // namespace meshtrain::kernels
