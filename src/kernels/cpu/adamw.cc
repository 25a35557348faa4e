// The AdamW element updates (optim/adamw.cc drives them over its segments and chunks).
// Element-wise with no reduction, so neither the blocks nor the vector width change a value.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/fp16.h"
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

// AdamW on elements [b, e): one expression for both updates below, so that the compiler
// contracts it into the same fused multiply-adds in each.
inline void adamw_elements(float* p, const float* g, float* m, float* v, size_t b, size_t e, const AdamWScalars& s) {
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
}

// The 16-bit conversions of one piece, inline (ops.h's to_half and from_half are entries
// that may split their work over the threads).
void widen_piece(Precision p, const uint16_t* x, float* out, size_t n) {
  if (p == Precision::kBf16) return widen_block_from_bf16(x, out, n);
  widen_block_from_fp16(x, out, n);
}
void round_piece(Precision p, const float* x, uint16_t* out, size_t n) {
  if (p == Precision::kBf16) return round_block_to_bf16(x, out, n);
  round_block_to_fp16(x, out, n);
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWScalars& s) {
  adam_blocks(n, [&](size_t b, size_t e) { adamw_elements(p, g, m, v, b, e, s); });
}

void adamw_update_half(Precision p, const uint16_t* g16, float grad_coef, float* w, float* m, float* v,
                       uint16_t* p16, size_t n, const AdamWScalars& s) {
  adam_blocks(n, [&](size_t b, size_t e) {
    constexpr size_t kPiece = 256;  // the widened gradients stay in L1
    float g[kPiece];
    for (size_t i = b; i < e; i += kPiece) {
      const size_t k = std::min(kPiece, e - i);
      widen_piece(p, g16 + i, g, k);
      if (grad_coef != 1.0f) {
#pragma omp simd
        for (size_t j = 0; j < k; j++) g[j] = g[j] * grad_coef;
      }
      adamw_elements(w + i, g, m + i, v + i, 0, k, s);
      round_piece(p, w + i, p16 + i, k);
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
