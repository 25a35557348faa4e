// Softmax cross-entropy over the real vocabulary columns of the logits.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

void crossentropy_forward(float* losses, float* lse, const float* logits, const int* targets, int N,
                          int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + (size_t)n * Vp;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < V; v++) mx = std::max(mx, x[v]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) sum += fast_exp(x[v] - mx);
    float l = mx + std::log(sum);
    lse[n] = l;
    losses[n] = l - x[targets[n]];
  }
}

void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int* targets, float dloss, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + (size_t)n * Vp;
    float* d = dlogits + (size_t)n * Vp;
    const float l = lse[n];
#pragma omp simd
    for (int v = 0; v < V; v++) d[v] = fast_exp(x[v] - l) * dloss;
    d[targets[n]] -= dloss;
  }
}

}  // namespace meshtrain::kernels
