// A linear layer whose every output element is summed in one fixed order, whatever the
// number of rows in the call (matmul_forward_rowwise in ops.h). oneDNN's sgemm picks its
// blocking, and with it the order of the additions, from M: a row computed beside others
// can round differently from the same row alone. Decoding batches sequences that must get
// the same logits as alone, so it uses this kernel.
//
// The order, for out[n][o] = bias[o] + sum_k inp[n][k] * weight[o][k]:
//   - 16 lane sums: lane l accumulates k = l, l + 16, l + 32, ... (below C rounded down to
//     16) by fused multiply-adds, starting from zero;
//   - the lanes folded in a fixed tree: l += l + 8, then l += l + 4, l + 2, l + 1;
//   - the remaining k (C mod 16 of them) fused into that sum in order, then the bias added.
// One AVX-512 register, two AVX2 registers or 16 scalars compute exactly those operations
// (a fused multiply-add rounds once on every path), so the result is also the same whatever
// the blocking, the thread count and the instruction set.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {

// The last steps of the fold, on 4 lanes: l += l + 2, then l += l + 1.
#if defined(__AVX2__)
inline float fold4(__m128 x) {
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}
#endif

// 16 lane sums and the operations the order above needs. kRows x kCols accumulators for
// full blocks of rows; a lone row takes 2 kCols weight rows at once (independent sums, to
// hide the multiply-add latency and keep more loads in flight).
#if defined(__AVX512F__)
struct Lanes {
  __m512 v = _mm512_setzero_ps();
  void fma(const float* a, const float* b) { v = _mm512_fmadd_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(b), v); }
  float fold() const {
    const __m256 x8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return fold4(_mm_add_ps(_mm256_castps256_ps128(x8), _mm256_extractf128_ps(x8, 1)));
  }
};
constexpr int kRows = 4, kCols = 4;  // 16 accumulators of 32 registers
#elif defined(__AVX2__) && defined(__FMA__)
struct Lanes {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  void fma(const float* a, const float* b) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + 8), _mm256_loadu_ps(b + 8), hi);
  }
  float fold() const {
    const __m256 x8 = _mm256_add_ps(lo, hi);
    return fold4(_mm_add_ps(_mm256_castps256_ps128(x8), _mm256_extractf128_ps(x8, 1)));
  }
};
constexpr int kRows = 2, kCols = 3;  // 12 accumulators of 16 registers
#else
struct Lanes {
  float v[16] = {};
  void fma(const float* a, const float* b) {
    for (int l = 0; l < 16; l++) v[l] = std::fma(a[l], b[l], v[l]);
  }
  float fold() const {
    float t[16];
    std::copy(v, v + 16, t);
    for (int half = 8; half > 0; half /= 2)
      for (int l = 0; l < half; l++) t[l] += t[l + half];
    return t[0];
  }
};
constexpr int kRows = 1, kCols = 1;
#endif
constexpr int kColBlock = 2 * kCols;  // weight rows per thread's unit of work

// The fold, the tail and the bias: the output element.
inline float finish(const Lanes& lanes, const float* x, const float* w, int k0, int C, float bias) {
  float sum = lanes.fold();
  for (int k = k0; k < C; k++) sum = std::fma(x[k], w[k], sum);
  return sum + bias;
}

// Rows [n0, n0 + R) by weight rows [o0, o0 + J).
template <int R, int J>
void block(float* out, const float* inp, const float* weight, const float* bias, int n0, int o0, int C, int OC) {
  Lanes acc[R][J];
  const int C16 = C / 16 * 16;
  for (int k = 0; k < C16; k += 16)
    for (int r = 0; r < R; r++)
      for (int j = 0; j < J; j++) acc[r][j].fma(inp + (size_t)(n0 + r) * C + k, weight + (size_t)(o0 + j) * C + k);
  for (int r = 0; r < R; r++)
    for (int j = 0; j < J; j++)
      out[(size_t)(n0 + r) * OC + o0 + j] = finish(acc[r][j], inp + (size_t)(n0 + r) * C,
                                                   weight + (size_t)(o0 + j) * C, C16, C, bias ? bias[o0 + j] : 0.0f);
}

// Every row against weight rows [o0, o0 + kColBlock): blocks of kRows rows, then pairs
// (where the registers hold 2 x kColBlock sums), then one row at a time.
void column_block(float* out, const float* inp, const float* weight, const float* bias, int N, int o0, int C, int OC) {
  int n = 0;
  for (; n + kRows <= N; n += kRows)
    for (int j = 0; j < kColBlock; j += kCols) block<kRows, kCols>(out, inp, weight, bias, n, o0 + j, C, OC);
  if constexpr (kRows > 2)
    for (; n + 2 <= N; n += 2) block<2, kColBlock>(out, inp, weight, bias, n, o0, C, OC);
  for (; n < N; n++) block<1, kColBlock>(out, inp, weight, bias, n, o0, C, OC);
}

}  // namespace

void matmul_forward_rowwise(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                            int OC) {
  const int blocks = OC / kColBlock;
  // Threads split the weight rows: each reads its share of the weights once for all rows.
#pragma omp parallel for schedule(static) if ((size_t)N * C * OC > 65536)
  for (int b = 0; b < blocks; b++) column_block(out, inp, weight, bias, N, b * kColBlock, C, OC);
  for (int o = blocks * kColBlock; o < OC; o++)
    for (int n = 0; n < N; n++) block<1, 1>(out, inp, weight, bias, n, o, C, OC);
}

}  // namespace meshtrain::kernels
