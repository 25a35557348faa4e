// Causal self-attention, blocked over query rows (the FlashAttention idea on a CPU): a
// task holds one block of kBlock query rows of one (batch row, head) and its scores
// against the keys it may see, so memory is O(kBlock*T) per thread, never B*NH*T*T.
// Backward recomputes the probabilities from the saved log-sum-exp of each row.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/memory.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/qkv_layout.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {

constexpr int kBlock = 64;

// Softmax numerator of one score row in place: p[j] = exp(p[j] - max) for j < n.
// Returns the sum of the exponentials and stores the row's max in *max.
float exp_shifted(float* p, int n, float* max) {
  const float mx = row_max(p, n);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; j++) {
    p[j] = fast_exp(p[j] - mx);
    sum += p[j];
  }
  *max = mx;
  return sum;
}

// probs[r, j] = exp(scores[r, j] - lse_row) for j <= i0 + r (causal), 0 beyond.
void causal_probs_from_lse(float* probs, const float* lse_rows, int i0, int rows, int kend) {
  for (int r = 0; r < rows; r++) {
    float* p = probs + (size_t)r * kend;
    int valid = i0 + r + 1;
    float l = lse_rows[r];
#pragma omp simd
    for (int j = 0; j < valid; j++) p[j] = fast_exp(p[j] - l);
    std::fill(p + valid, p + kend, 0.0f);
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, int NKV,
                       Precision p) {
  if (p == Precision::kBf16) return attention_forward_bf16(out, lse, qkv, B, T, C, NH, NKV);
  const QkvLayout at(C, NH, NKV);
  const int hs = at.hs, ld = at.ld;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nblocks = (T + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    Buffer<float> scores(MemCategory::kWorkspace, (size_t)kBlock * T);
    // Later blocks see more keys: dynamic scheduling balances; results do not depend on it.
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        for (int blk = 0; blk < nblocks; blk++) {
          const float *q = qkv + at.q(b, h, T), *k = qkv + at.k(b, h, T), *v = qkv + at.v(b, h, T);
          const int i0 = blk * kBlock, rows = std::min(kBlock, T - i0), kend = i0 + rows;
          float* s = scores.data();
          gemm(false, true, rows, kend, hs, scale, q + (size_t)i0 * ld, ld, k, ld, 0.0f, s, kend);
          float* lse_rows = lse + ((size_t)b * NH + h) * T + i0;
          for (int r = 0; r < rows; r++) {
            float* p = s + (size_t)r * kend;
            int valid = i0 + r + 1;
            float mx;
            const float sum = exp_shifted(p, valid, &mx);
            float inv = 1.0f / sum;
#pragma omp simd
            for (int j = 0; j < valid; j++) p[j] *= inv;
            std::fill(p + valid, p + kend, 0.0f);
            lse_rows[r] = mx + std::log(sum);
          }
          gemm(false, false, rows, hs, kend, 1.0f, s, kend, v, ld, 0.0f, out + at.out(b, h, T) + (size_t)i0 * C, C);
        }
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH, int NKV, Precision p) {
  if (p == Precision::kBf16) return attention_backward_bf16(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
  const QkvLayout at(C, NH, NKV);
  const int hs = at.hs, ld = at.ld;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  auto zero_columns = [&](float* x) {
    for (int t = 0; t < T; t++) std::fill(x + (size_t)t * ld, x + (size_t)t * ld + hs, 0.0f);
  };
#pragma omp parallel
  {
    Buffer<float> probs(MemCategory::kWorkspace, (size_t)kBlock * T);
    Buffer<float> dprobs(MemCategory::kWorkspace, (size_t)kBlock * T);
    // One task per (b, key/value head): its dK and dV sum over all query blocks of every
    // query head that shares it, in head order.
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
      for (int g = 0; g < NKV; g++) {
        const int h0 = g * at.group;
        float* dk = dqkv + at.k(b, h0, T);
        float* dv = dqkv + at.v(b, h0, T);
        const float *k = qkv + at.k(b, h0, T), *v = qkv + at.v(b, h0, T);
        zero_columns(dk), zero_columns(dv);
        for (int h = h0; h < h0 + at.group; h++) {
          float* dq = dqkv + at.q(b, h, T);
          zero_columns(dq);
          const float* lse_bh = lse + ((size_t)b * NH + h) * T;
          for (int i0 = 0; i0 < T; i0 += kBlock) {
            const int rows = std::min(kBlock, T - i0), kend = i0 + rows;
            const float* q = qkv + at.q(b, h, T) + (size_t)i0 * ld;
            const float* o = out + at.out(b, h, T) + (size_t)i0 * C;
            const float* d_o = dout + at.out(b, h, T) + (size_t)i0 * C;
            float* p = probs.data();
            float* dp = dprobs.data();
            gemm(false, true, rows, kend, hs, scale, q, ld, k, ld, 0.0f, p, kend);
            causal_probs_from_lse(p, lse_bh + i0, i0, rows, kend);
            gemm(true, false, kend, hs, rows, 1.0f, p, kend, d_o, C, 1.0f, dv, ld);  // dV += P^T dO
            gemm(false, true, rows, kend, hs, 1.0f, d_o, C, v, ld, 0.0f, dp, kend);  // dP = dO V^T
            for (int r = 0; r < rows; r++) {
              // dS = P * (dP - rowsum(dO * O)); masked entries have P = 0.
              float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
              for (int d = 0; d < hs; d++) dot += d_o[(size_t)r * C + d] * o[(size_t)r * C + d];
              float* pr = p + (size_t)r * kend;
              float* dpr = dp + (size_t)r * kend;
#pragma omp simd
              for (int j = 0; j < kend; j++) dpr[j] = pr[j] * (dpr[j] - dot);
            }
            gemm(false, false, rows, hs, kend, scale, dp, kend, k, ld, 1.0f, dq + (size_t)i0 * ld, ld);  // dQ += dS K
            gemm(true, false, kend, hs, rows, scale, dp, kend, q, ld, 1.0f, dk, ld);  // dK += dS^T Q
          }
        }
      }
    }
  }
}

}  // namespace meshtrain::kernels

namespace meshtrain::kernels {

void attention_cached_forward(float* out, const float* q, int ldq, const float* k_cache,
                              const float* v_cache, int p, int n, int C, int NH, int NKV) {
  const int hs = C / NH, CK = NKV * hs, group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
  {
    Buffer<float> scores(MemCategory::kWorkspace, (size_t)p + n);
#pragma omp for collapse(2) schedule(static)
    for (int i = 0; i < n; i++) {
      for (int h = 0; h < NH; h++) {
        const int keys = p + i + 1;
        float* s = scores.data();
        // One query row: a GEMV against the cached keys, softmax, GEMV with the values.
        const size_t kv = (size_t)(h / group) * hs;
        gemm(false, true, 1, keys, hs, scale, q + (size_t)i * ldq + h * hs, ldq, k_cache + kv, CK, 0.0f, s,
             keys);
        float mx;
        const float sum = exp_shifted(s, keys, &mx);
        gemm(false, false, 1, hs, keys, 1.0f / sum, s, keys, v_cache + kv, CK, 0.0f, out + (size_t)i * C + h * hs,
             C);
      }
    }
  }
}

}  // namespace meshtrain::kernels
