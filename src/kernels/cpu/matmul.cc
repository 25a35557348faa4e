// Linear layers on top of gemm(): weight is [OC, C] (PyTorch's nn.Linear layout).
#include <algorithm>
#include <cstring>

#include "kernels/ops.h"

namespace meshtrain::kernels {

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, Precision p) {
  if (bias) {
    // Seed every row with the bias and let the GEMM accumulate (beta = 1): one pass less.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) std::memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
  }
  gemm(p, false, true, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, Precision p) {
  if (dinp) gemm(p, false, false, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  gemm(p, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias) {
    // Column ranges per thread: a fixed summation order whatever the thread count.
    constexpr int kChunk = 64;
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += kChunk) {
      int o1 = std::min(OC, o0 + kChunk);
      for (int n = 0; n < N; n++) {
        const float* d = dout + (size_t)n * OC;
#pragma omp simd
        for (int o = o0; o < o1; o++) dbias[o] += d[o];
      }
    }
  }
}

}  // namespace meshtrain::kernels
