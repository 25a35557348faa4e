// SwiGLU over [gate | up] rows: silu(gate) * up.
#include <algorithm>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {
inline float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }
}  // namespace

void swiglu_forward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* g = inp + (size_t)n * 2 * F;
    const float* u = g + F;
    float* o = out + (size_t)n * F;
#pragma omp simd
    for (int f = 0; f < F; f++) o[f] = g[f] * sigmoid(g[f]) * u[f];
  }
}

void swiglu_forward(uint16_t* out, const float* inp, int N, int F) {
  constexpr int kBlock = 1024;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* g = inp + (size_t)n * 2 * F;
    const float* u = g + F;
    alignas(64) float y[kBlock];
    for (int f0 = 0; f0 < F; f0 += kBlock) {
      const int f1 = std::min(F, f0 + kBlock);
#pragma omp simd
      for (int f = f0; f < f1; f++) y[f - f0] = g[f] * sigmoid(g[f]) * u[f];
      round_block_to_bf16(y, out + (size_t)n * F + f0, f1 - f0);
    }
  }
}

// d/dg silu(g) = s + g s (1 - s), s = sigmoid(g).
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* g = inp + (size_t)n * 2 * F;
    const float* u = g + F;
    const float* d = dout + (size_t)n * F;
    float* dg = dinp + (size_t)n * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int f = 0; f < F; f++) {
      const float s = sigmoid(g[f]);
      dg[f] = d[f] * u[f] * (s + g[f] * s * (1.0f - s));
      du[f] = d[f] * g[f] * s;
    }
  }
}

}  // namespace meshtrain::kernels
