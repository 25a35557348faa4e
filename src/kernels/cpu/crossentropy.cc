// Softmax cross-entropy over the real vocabulary columns of the logits.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

void crossentropy_forward(float* lse, float* target_logit, const float* logits,
                          const int* targets, int N, int vn, int ld, int vb) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + (size_t)n * ld;
    const int t = targets[n] - vb;
    target_logit[n] = (t >= 0 && t < vn) ? x[t] : 0.0f;
    if (vn == 0) {
      lse[n] = -INFINITY;
      continue;
    }
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < vn; v++) mx = std::max(mx, x[v]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < vn; v++) sum += fast_exp(x[v] - mx);
    lse[n] = mx + std::log(sum);
  }
}

void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int* targets, float dloss, int N, int vn, int ld, int vb) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + (size_t)n * ld;
    float* d = dlogits + (size_t)n * ld;
    const float l = lse[n];
#pragma omp simd
    for (int v = 0; v < vn; v++) d[v] = fast_exp(x[v] - l) * dloss;
    const int t = targets[n] - vb;
    if (t >= 0 && t < vn) d[t] -= dloss;
  }
}

}  // namespace meshtrain::kernels
