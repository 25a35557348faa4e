// Attention by key ranges (ops.h, attention_ranged_forward): the kernel under document masks
// and context parallelism. Like attention.cc it works on blocks of kRowBlock query rows, and a
// block's scores span only the keys some row of it may see, [min lo, max hi): a thread's
// workspace is O(kRowBlock x m), and under a document mask the blocks far from a document's
// start multiply fewer keys. Backward recomputes the probabilities from the final
// log-sum-exp, so that a ring step's share of the gradient needs only that block's keys.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/memory.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {

constexpr int kRowBlock = 64;

// The keys query rows [i0, i0+rows) of batch row b see between them, [*begin, *end), or
// an empty span.
void block_span(const AttentionBlock& x, int b, int i0, int rows, int* begin, int* end) {
  int lo = x.m, hi = 0;
  for (int r = 0; r < rows; r++) {
    const size_t i = (size_t)b * x.n + i0 + r;
    if (x.lo[i] >= x.hi[i]) continue;
    lo = std::min(lo, x.lo[i]), hi = std::max(hi, x.hi[i]);
  }
  *begin = lo, *end = std::max(lo, hi);
}

// Row r of a block's scores (span keys from `begin`) as probabilities exp(s - lse) inside
// the row's range and 0 outside it; a row with no keys is all 0.
void probs_in_range(float* p, int span, int begin, int lo, int hi, float lse) {
  const int a = std::clamp(lo - begin, 0, span), e = std::clamp(hi - begin, a, span);
  std::fill(p, p + a, 0.0f);
#pragma omp simd
  for (int j = a; j < e; j++) p[j] = fast_exp(p[j] - lse);
  std::fill(p + e, p + span, 0.0f);
}

}  // namespace

void attention_ranged_forward(float* out, int ldo, float* lse, const AttentionBlock& x) {
  const int hs = x.hs, group = x.NH / x.NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nblocks = (x.n + kRowBlock - 1) / kRowBlock;
  constexpr float kNoKeys = -std::numeric_limits<float>::infinity();
#pragma omp parallel
  {
    Buffer<float> scores(MemCategory::kWorkspace, (size_t)kRowBlock * std::max(x.m, 1));
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < x.B; b++) {
      for (int h = 0; h < x.NH; h++) {
        for (int blk = 0; blk < nblocks; blk++) {
          const int i0 = blk * kRowBlock, rows = std::min(kRowBlock, x.n - i0);
          int begin, end;
          block_span(x, b, i0, rows, &begin, &end);
          const int span = end - begin;
          const float* q = x.q + ((size_t)b * x.n + i0) * x.ldq + (size_t)h * hs;
          const size_t kv = ((size_t)b * x.m + begin) * x.ldkv + (size_t)(h / group) * hs;
          float* o = out + ((size_t)b * x.n + i0) * ldo + (size_t)h * hs;
          float* lse_rows = lse + ((size_t)b * x.NH + h) * x.n + i0;
          float* s = scores.data();
          if (span > 0) gemm(false, true, rows, span, hs, scale, q, x.ldq, x.k + kv, x.ldkv, 0.0f, s, span);
          for (int r = 0; r < rows; r++) {
            const size_t i = (size_t)b * x.n + i0 + r;
            const int a = std::clamp(x.lo[i] - begin, 0, span), e = std::clamp(x.hi[i] - begin, a, span);
            float* p = s + (size_t)r * span;
            if (e == a) {
              lse_rows[r] = kNoKeys;
              std::fill(p, p + span, 0.0f);
              continue;
            }
            const float mx = row_max(p + a, e - a);
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int j = a; j < e; j++) {
              p[j] = fast_exp(p[j] - mx);
              sum += p[j];
            }
            const float inv = 1.0f / sum;
#pragma omp simd
            for (int j = a; j < e; j++) p[j] *= inv;
            std::fill(p, p + a, 0.0f);
            std::fill(p + e, p + span, 0.0f);
            lse_rows[r] = mx + std::log(sum);
          }
          if (span > 0) {
            gemm(false, false, rows, hs, span, 1.0f, s, span, x.v + kv, x.ldkv, 0.0f, o, ldo);
          } else {
            for (int r = 0; r < rows; r++) std::fill(o + (size_t)r * ldo, o + (size_t)r * ldo + hs, 0.0f);
          }
        }
      }
    }
  }
}

void attention_ranged_backward(float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                               const float* out, int ldo, const float* lse, const AttentionBlock& x) {
  const int hs = x.hs, group = x.NH / x.NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
  {
    Buffer<float> probs(MemCategory::kWorkspace, (size_t)kRowBlock * std::max(x.m, 1));
    Buffer<float> dprobs(MemCategory::kWorkspace, (size_t)kRowBlock * std::max(x.m, 1));
    // One task per (b, key/value head): its dK and dV sum over every query block of every
    // query head sharing it, in head order, so the sums never race and never reorder.
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < x.B; b++) {
      for (int g = 0; g < x.NKV; g++) {
        const size_t kv0 = (size_t)b * x.m * x.ldkv + (size_t)g * hs;
        const size_t dkv0 = (size_t)b * x.m * lddkv + (size_t)g * hs;
        for (int h = g * group; h < (g + 1) * group; h++) {
          const float* lse_bh = lse + ((size_t)b * x.NH + h) * x.n;
          for (int i0 = 0; i0 < x.n; i0 += kRowBlock) {
            const int rows = std::min(kRowBlock, x.n - i0);
            int begin, end;
            block_span(x, b, i0, rows, &begin, &end);
            const int span = end - begin;
            if (span == 0) continue;
            const size_t row0 = (size_t)b * x.n + i0;
            const float* q = x.q + row0 * x.ldq + (size_t)h * hs;
            const float* k = x.k + kv0 + (size_t)begin * x.ldkv;
            const float* v = x.v + kv0 + (size_t)begin * x.ldkv;
            const float* o = out + row0 * ldo + (size_t)h * hs;
            const float* d_o = dout + row0 * ldo + (size_t)h * hs;
            float* p = probs.data();
            float* dp = dprobs.data();
            gemm(false, true, rows, span, hs, scale, q, x.ldq, k, x.ldkv, 0.0f, p, span);
            for (int r = 0; r < rows; r++)
              probs_in_range(p + (size_t)r * span, span, begin, x.lo[row0 + r], x.hi[row0 + r], lse_bh[i0 + r]);
            float* dk_span = dk + dkv0 + (size_t)begin * lddkv;
            float* dv_span = dv + dkv0 + (size_t)begin * lddkv;
            gemm(true, false, span, hs, rows, 1.0f, p, span, d_o, ldo, 1.0f, dv_span, lddkv);  // dV += P^T dO
            gemm(false, true, rows, span, hs, 1.0f, d_o, ldo, v, x.ldkv, 0.0f, dp, span);      // dP = dO V^T
            for (int r = 0; r < rows; r++) {
              // dS = P * (dP - rowsum(dO * O)); outside the range P = 0.
              float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
              for (int d = 0; d < hs; d++) dot += d_o[(size_t)r * ldo + d] * o[(size_t)r * ldo + d];
              const float* pr = p + (size_t)r * span;
              float* dpr = dp + (size_t)r * span;
#pragma omp simd
              for (int j = 0; j < span; j++) dpr[j] = pr[j] * (dpr[j] - dot);
            }
            float* dq_rows = dq + row0 * lddq + (size_t)h * hs;
            gemm(false, false, rows, hs, span, scale, dp, span, k, x.ldkv, 1.0f, dq_rows, lddq);  // dQ += dS K
            gemm(true, false, span, hs, rows, scale, dp, span, q, x.ldq, 1.0f, dk_span, lddkv);   // dK += dS^T Q
          }
        }
      }
    }
  }
}

void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part, int B, int n,
                     int NH, int hs, int ld) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      float* l = lse + ((size_t)b * NH + h) * n;
      const float* lp = lse_part + ((size_t)b * NH + h) * n;
      for (int i = 0; i < n; i++) {
        if (std::isinf(lp[i]) && lp[i] < 0) continue;  // the part saw no keys
        float* o = out + ((size_t)b * n + i) * ld + (size_t)h * hs;
        const float* op = out_part + ((size_t)b * n + i) * ld + (size_t)h * hs;
        const float mx = std::max(l[i], lp[i]);
        const float wa = std::exp(l[i] - mx), wb = std::exp(lp[i] - mx);  // exp(-inf) = 0: no keys yet
        const float total = wa + wb, fa = wa / total, fb = wb / total;
        for (int d = 0; d < hs; d++) o[d] = fa * o[d] + fb * op[d];
        l[i] = mx + std::log(total);
      }
    }
  }
}

}  // namespace meshtrain::kernels
