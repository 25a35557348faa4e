// RMSNorm, one row per iteration as layernorm_forward/backward (elementwise.cc).
#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace meshtrain::kernels {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + (size_t)n * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    const float s = 1.0f / std::sqrt(ss / C + eps);
    float* o = out + (size_t)n * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

// y = x * s * w with s = (mean(x^2) + eps)^-1/2:
//   dx = s * w * dy - s^3 / C * x * sum(w * dy * x),  dw += dy * x * s.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int n = 0; n < N; n++) {
      const float* x = inp + (size_t)n * C;
      const float* d = dout + (size_t)n * C;
      const float s = rstd[n];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int c = 0; c < C; c++) dot += weight[c] * d[c] * x[c];
      const float k = s * s * s * dot / C;
      float* di = dinp + (size_t)n * C;
#pragma omp simd
      for (int c = 0; c < C; c++) di[c] += s * weight[c] * d[c] - k * x[c];
    }
    // Column chunks split over threads, rows added in order: deterministic and race-free.
    constexpr int kColumnChunk = 64;
#pragma omp for schedule(static)
    for (int c0 = 0; c0 < C; c0 += kColumnChunk) {
      const int c1 = std::min(C, c0 + kColumnChunk);
      for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        const float s = rstd[n];
#pragma omp simd
        for (int c = c0; c < c1; c++) dweight[c] += d[c] * x[c] * s;
      }
    }
  }
}

}  // namespace meshtrain::kernels
