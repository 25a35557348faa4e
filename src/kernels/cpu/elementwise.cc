// Row-wise and element-wise kernels: embedding, LayerNorm, GELU, residual.
// Reductions over rows (parameter gradients) are split by columns so every sum is
// computed by one thread in a fixed order: results do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/bf16.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {
constexpr float kLayerNormEps = 1e-5f;
constexpr int kColumnChunk = 64;
}  // namespace

namespace {

// out = wte row (looked up by token, zero outside the slice) + wpe row; copy_row(id, o)
// writes wte's row id into o.
template <typename CopyRow>
void lookup_embeddings(float* out, const int* inp, const float* wpe, int B, int T, int C, int vb,
                       int vn, const int* positions, CopyRow copy_row) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float* o = out + ((size_t)b * T + t) * C;
      const int id = inp[b * T + t] - vb;
      if (id >= 0 && id < vn) copy_row(id, o);
      else std::fill(o, o + C, 0.0f);
      if (!wpe) continue;
      const float* p = wpe + (size_t)(positions ? positions[(size_t)b * T + t] : t) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] += p[c];
    }
  }
}

}  // namespace

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                     int C, int vb, int vn, const int* positions) {
  lookup_embeddings(out, inp, wpe, B, T, C, vb, vn, positions, [&](int id, float* o) {
    std::copy(wte + (size_t)id * C, wte + (size_t)(id + 1) * C, o);
  });
}

void encoder_forward(float* out, const int* inp, const uint16_t* wte, const float* wpe, int B,
                     int T, int C, int vb, int vn, const int* positions) {
  lookup_embeddings(out, inp, wpe, B, T, C, vb, vn, positions, [&](int id, float* o) {
    widen_block_from_bf16(wte + (size_t)id * C, o, C);
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T,
                      int C, int vb, int vn, const int* positions) {
  // Tokens repeat, so rows of dwte collide: each thread owns a column range.
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += kColumnChunk) {
    int c1 = std::min(C, c0 + kColumnChunk);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const float* d = dout + ((size_t)b * T + t) * C;
        const int id = inp[b * T + t] - vb;
        if (id >= 0 && id < vn) {
          float* de = dwte + (size_t)id * C;
          for (int c = c0; c < c1; c++) de[c] += d[c];
        }
        if (dwpe) {
          float* dp = dwpe + (size_t)(positions ? positions[(size_t)b * T + t] : t) * C;
          for (int c = c0; c < c1; c++) dp[c] += d[c];
        }
      }
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + (size_t)n * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c];
    float m = sum / C;
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
    float s = 1.0f / std::sqrt(var / C + kLayerNormEps);
    float* o = out + (size_t)n * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int n = 0; n < N; n++) {
      const float* x = inp + (size_t)n * C;
      const float* d = dout + (size_t)n * C;
      const float m = mean[n], s = rstd[n];
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int c = 0; c < C; c++) {
        float dnorm = weight[c] * d[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (x[c] - m) * s;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      float* di = dinp + (size_t)n * C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        float norm = (x[c] - m) * s;
        di[c] += (weight[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
#pragma omp for schedule(static)
    for (int c0 = 0; c0 < C; c0 += kColumnChunk) {
      int c1 = std::min(C, c0 + kColumnChunk);
      for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        const float m = mean[n], s = rstd[n];
#pragma omp simd
        for (int c = c0; c < c1; c++) {
          dweight[c] += d[c] * (x[c] - m) * s;
          dbias[c] += d[c];
        }
      }
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
}

namespace {
inline float gelu(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + fast_tanh(u));
}
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = gelu(inp[i]);
}

void gelu_forward(uint16_t* out, const float* inp, size_t n) {
  constexpr size_t kBlock = 1024;
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    alignas(64) float y[kBlock];
#pragma omp simd
    for (size_t i = b; i < e; i++) y[i - b] = gelu(inp[i]);
    round_block_to_bf16(y, out + b, e - b);
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float u = kGeluScale * (x + 0.044715f * x * x * x);
    float th = fast_tanh(u);
    float sech2 = 1.0f - th * th;
    float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
  }
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void bias_residual_forward(float* out, const float* residual, const float* x, const float* bias,
                           int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* o = out + (size_t)n * C;
    const float* r = residual + (size_t)n * C;
    const float* v = x + (size_t)n * C;
    if (bias) {
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = r[c] + v[c] + bias[c];
    } else {
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = r[c] + v[c];
    }
  }
}

namespace {
// SplitMix64's finaliser: a strong 64-bit mix, cheap enough per element.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}
}  // namespace

bool dropout_keep(uint64_t key, int64_t row, int col, float p) {
  const uint64_t h = mix64(key ^ mix64((uint64_t)row * 0x9E3779B97F4A7C15ull + (uint64_t)col));
  const double u = (double)(h >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  return u >= p;
}

void dropout_forward(float* x, int rows, int C, float p, uint64_t key, int64_t row0) {
  if (p <= 0.0f) return;
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; r++) {
    float* xr = x + (size_t)r * C;
    for (int c = 0; c < C; c++) xr[c] = dropout_keep(key, row0 + r, c, p) ? xr[c] * scale : 0.0f;
  }
}

}  // namespace meshtrain::kernels
