// Softmax cross-entropy over the real vocabulary columns of the logits.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/bf16.h"
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
    const float mx = row_max(x, vn);
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

// Row n's bf16 words overwrite the first half of its own floats, a chunk at a time: a chunk
// of k columns at column v is copied out (bytes [4v, 4v + 4k)) before its words are stored
// (bytes [2v, 2v + 2k)), which lie inside what has been read: the row is read before it is
// overwritten. (memcpy reads as char, which aliases the uint16_t stores: the order holds.)
uint16_t* crossentropy_backward_bf16_inplace(float* logits, const float* lse, const int* targets,
                                             float dloss, int N, int vn, int ld, int vb) {
  uint16_t* out = reinterpret_cast<uint16_t*>(logits);
  constexpr int kChunk = 2048;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + (size_t)n * ld;
    uint16_t* d = out + (size_t)n * 2 * ld;
    const float l = lse[n];
    const int t = targets[n] - vb;
    alignas(64) float chunk[kChunk];
    for (int v = 0; v < vn; v += kChunk) {
      const int k = std::min(kChunk, vn - v);
      std::memcpy(chunk, x + v, sizeof(float) * k);
#pragma omp simd
      for (int i = 0; i < k; i++) chunk[i] = fast_exp(chunk[i] - l) * dloss;
      if (t >= v && t < v + k) chunk[t - v] -= dloss;
      round_block_to_bf16(chunk, d + v, k);
    }
  }
  return out;
}

}  // namespace meshtrain::kernels
