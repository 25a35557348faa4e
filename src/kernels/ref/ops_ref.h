// Naive reference operators: the test oracle. Plain loops, templated on the scalar type so
// that finite-difference gradient checks run in double. Same argument order and gradient
// conventions as kernels/ops.h. Attention here materialises the full T*T score matrix.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace meshtrain::kernels::ref {

// x rounded to the nearest IEEE half (11 significant bits, ties to even; subnormals in
// steps of 2^-24; |x| >= 65520 becomes infinity), as a double.
inline double fp16_round(double x) {
  if (x == 0 || std::isnan(x) || std::isinf(x)) return x;
  if (std::abs(x) < std::ldexp(1.0, -14))  // subnormal range: a fixed step of 2^-24
    return std::ldexp(std::nearbyint(std::ldexp(x, 24)), -24);
  int e;
  const double m = std::frexp(x, &e);
  const double r = std::ldexp(std::nearbyint(std::ldexp(m, 11)), e - 11);
  return std::abs(r) > 65504 ? std::copysign(INFINITY, x) : r;
}

// x rounded to the nearest bfloat16 (8 significant bits, ties to even), as a double: the
// value a bf16 GEMM multiplies. Finite, normal inputs only (the test's random data).
inline double bf16_round(double x) {
  if (x == 0) return x;
  int e;
  const double m = std::frexp(x, &e);   // x = m * 2^e, 0.5 <= |m| < 1
  const double scaled = std::ldexp(m, 8);  // 8 significant bits kept
  return std::ldexp(std::nearbyint(scaled), e - 8);  // nearbyint: ties to even
}

template <typename F>
void encoder_forward(F* out, const int* inp, const F* wte, const F* wpe, int B, int T, int C,
                     int vb, int vn, const int* positions = nullptr) {
  for (int bt = 0; bt < B * T; bt++) {
    const bool mine = inp[bt] >= vb && inp[bt] < vb + vn;
    for (int c = 0; c < C; c++)
      out[(size_t)bt * C + c] = (mine ? wte[(size_t)(inp[bt] - vb) * C + c] : F(0)) +
                                (wpe ? wpe[(size_t)(positions ? positions[bt] : bt % T) * C + c] : F(0));
  }
}

template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int* inp, int B, int T, int C,
                      int vb, int vn, const int* positions = nullptr) {
  for (int bt = 0; bt < B * T; bt++)
    for (int c = 0; c < C; c++) {
      if (inp[bt] >= vb && inp[bt] < vb + vn)
        dwte[(size_t)(inp[bt] - vb) * C + c] += dout[(size_t)bt * C + c];
      if (dwpe) dwpe[(size_t)(positions ? positions[bt] : bt % T) * C + c] += dout[(size_t)bt * C + c];
    }
}

template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias,
                       int N, int C) {
  for (int n = 0; n < N; n++) {
    const F* x = inp + (size_t)n * C;
    F m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    F s = F(1) / std::sqrt(v + F(1e-5));
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <typename F>
void layernorm_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp,
                        const F* weight, const F* mean, const F* rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const F* x = inp + (size_t)n * C;
    const F* d = dout + (size_t)n * C;
    F a = 0, b = 0;
    for (int c = 0; c < C; c++) {
      F norm = (x[c] - mean[n]) * rstd[n];
      a += weight[c] * d[c];
      b += weight[c] * d[c] * norm;
      dweight[c] += d[c] * norm;
      dbias[c] += d[c];
    }
    a /= C;
    b /= C;
    for (int c = 0; c < C; c++) {
      F norm = (x[c] - mean[n]) * rstd[n];
      dinp[(size_t)n * C + c] += (weight[c] * d[c] - a - norm * b) * rstd[n];
    }
  }
}

template <typename F>
void matmul_forward(F* out, const F* inp, const F* weight, const F* bias, int N, int C, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      F acc = bias ? bias[o] : F(0);
      for (int c = 0; c < C; c++) acc += inp[(size_t)n * C + c] * weight[(size_t)o * C + c];
      out[(size_t)n * OC + o] = acc;
    }
}

template <typename F>
void matmul_backward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                     int N, int C, int OC) {
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) {
      F acc = 0;
      for (int o = 0; o < OC; o++) acc += dout[(size_t)n * OC + o] * weight[(size_t)o * C + c];
      if (dinp) dinp[(size_t)n * C + c] = acc;
    }
    for (int o = 0; o < OC; o++) {
      F d = dout[(size_t)n * OC + o];
      for (int c = 0; c < C; c++) dweight[(size_t)o * C + c] += d * inp[(size_t)n * C + c];
      if (dbias) dbias[o] += d;
    }
  }
}

// Attention's operand offsets in qkv rows of ld = C + 2*NKV*hs (see ops.h).
struct RefQkv {
  int hs, C, CK, ld, group;
  RefQkv(int C_, int NH, int NKV) : hs(C_ / NH), C(C_), CK(NKV * (C_ / NH)), ld(C_ + 2 * CK), group(NH / NKV) {}
  size_t q(int b, int t, int h, int T) const { return ((size_t)b * T + t) * ld + (size_t)h * hs; }
  size_t k(int b, int t, int h, int T) const { return ((size_t)b * T + t) * ld + C + (size_t)(h / group) * hs; }
  size_t v(int b, int t, int h, int T) const { return k(b, t, h, T) + CK; }
};

template <typename F>
void attention_forward(F* out, F* lse, const F* qkv, int B, int T, int C, int NH, int NKV) {
  const RefQkv at(C, NH, NKV);
  const int hs = at.hs;
  const F scale = F(1) / std::sqrt(F(hs));
  std::vector<F> row(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const F* q = qkv + at.q(b, i, h, T);
        F mx = -INFINITY;
        for (int j = 0; j <= i; j++) {
          const F* k = qkv + at.k(b, j, h, T);
          F s = 0;
          for (int d = 0; d < hs; d++) s += q[d] * k[d];
          row[j] = s * scale;
          mx = std::max(mx, row[j]);
        }
        F sum = 0;
        for (int j = 0; j <= i; j++) sum += std::exp(row[j] - mx);
        F* o = out + ((size_t)b * T + i) * C + h * hs;
        for (int d = 0; d < hs; d++) o[d] = 0;
        for (int j = 0; j <= i; j++) {
          F p = std::exp(row[j] - mx) / sum;
          const F* v = qkv + at.v(b, j, h, T);
          for (int d = 0; d < hs; d++) o[d] += p * v[d];
        }
        lse[((size_t)b * NH + h) * T + i] = mx + std::log(sum);
      }
}

template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse, int B,
                        int T, int C, int NH, int NKV) {
  const RefQkv at(C, NH, NKV);
  const int hs = at.hs;
  const F scale = F(1) / std::sqrt(F(hs));
  std::fill(dqkv, dqkv + (size_t)B * T * at.ld, F(0));
  std::vector<F> p(T), dp(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const size_t qi = at.q(b, i, h, T);
        const F* dO = dout + ((size_t)b * T + i) * C + h * hs;
        const F* O = out + ((size_t)b * T + i) * C + h * hs;
        F dot = 0;
        for (int d = 0; d < hs; d++) dot += dO[d] * O[d];
        for (int j = 0; j <= i; j++) {
          const size_t kj = at.k(b, j, h, T), vj = at.v(b, j, h, T);
          F s = 0;
          for (int d = 0; d < hs; d++) s += qkv[qi + d] * qkv[kj + d];
          p[j] = std::exp(s * scale - lse[((size_t)b * NH + h) * T + i]);
          F g = 0;
          for (int d = 0; d < hs; d++) g += dO[d] * qkv[vj + d];
          dp[j] = p[j] * (g - dot);
        }
        for (int j = 0; j <= i; j++) {
          const size_t kj = at.k(b, j, h, T), vj = at.v(b, j, h, T);
          for (int d = 0; d < hs; d++) {
            dqkv[qi + d] += scale * dp[j] * qkv[kj + d];
            dqkv[kj + d] += scale * dp[j] * qkv[qi + d];
            dqkv[vj + d] += p[j] * dO[d];
          }
        }
      }
}

// Attention by key ranges (ops.h): query row i of batch row b sees keys [lo, hi) of the
// block; q [B,n,ldq], k and v [B,m,ldkv], out [B,n,ldo], lse [B,NH,n] (-inf: no keys).
template <typename F>
struct RefAttentionBlock {
  const F* q;
  int ldq;
  const F *k, *v;
  int ldkv;
  int B, n, m, NH, NKV, hs;
  const int *lo, *hi;
};

template <typename F>
void attention_ranged_forward(F* out, int ldo, F* lse, const RefAttentionBlock<F>& x) {
  const F scale = F(1) / std::sqrt(F(x.hs));
  const int group = x.NH / x.NKV;
  std::vector<F> s(x.m);
  for (int b = 0; b < x.B; b++)
    for (int h = 0; h < x.NH; h++)
      for (int i = 0; i < x.n; i++) {
        const size_t row = (size_t)b * x.n + i;
        const F* q = x.q + row * x.ldq + (size_t)h * x.hs;
        F* o = out + row * ldo + (size_t)h * x.hs;
        for (int d = 0; d < x.hs; d++) o[d] = 0;
        F mx = -INFINITY;
        for (int j = x.lo[row]; j < x.hi[row]; j++) {
          const F* k = x.k + ((size_t)b * x.m + j) * x.ldkv + (size_t)(h / group) * x.hs;
          F dot = 0;
          for (int d = 0; d < x.hs; d++) dot += q[d] * k[d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        F sum = 0;
        for (int j = x.lo[row]; j < x.hi[row]; j++) sum += std::exp(s[j] - mx);
        for (int j = x.lo[row]; j < x.hi[row]; j++) {
          const F* v = x.v + ((size_t)b * x.m + j) * x.ldkv + (size_t)(h / group) * x.hs;
          for (int d = 0; d < x.hs; d++) o[d] += std::exp(s[j] - mx) / sum * v[d];
        }
        lse[((size_t)b * x.NH + h) * x.n + i] = sum > 0 ? mx + std::log(sum) : F(-INFINITY);
      }
}

// Adds the block's share of the gradient of the final out (with its final lse) to dq, dk, dv.
template <typename F>
void attention_ranged_backward(F* dq, int lddq, F* dk, F* dv, int lddkv, const F* dout, const F* out, int ldo,
                               const F* lse, const RefAttentionBlock<F>& x) {
  const F scale = F(1) / std::sqrt(F(x.hs));
  const int group = x.NH / x.NKV;
  for (int b = 0; b < x.B; b++)
    for (int h = 0; h < x.NH; h++)
      for (int i = 0; i < x.n; i++) {
        const size_t row = (size_t)b * x.n + i;
        const F* q = x.q + row * x.ldq + (size_t)h * x.hs;
        const F* dO = dout + row * ldo + (size_t)h * x.hs;
        const F* O = out + row * ldo + (size_t)h * x.hs;
        F rowdot = 0;
        for (int d = 0; d < x.hs; d++) rowdot += dO[d] * O[d];
        for (int j = x.lo[row]; j < x.hi[row]; j++) {
          const size_t kv = ((size_t)b * x.m + j) * x.ldkv + (size_t)(h / group) * x.hs;
          const size_t dkv = ((size_t)b * x.m + j) * lddkv + (size_t)(h / group) * x.hs;
          F s = 0, g = 0;
          for (int d = 0; d < x.hs; d++) s += q[d] * x.k[kv + d], g += dO[d] * x.v[kv + d];
          const F p = std::exp(s * scale - lse[((size_t)b * x.NH + h) * x.n + i]);
          const F ds = p * (g - rowdot);
          for (int d = 0; d < x.hs; d++) {
            dq[row * lddq + (size_t)h * x.hs + d] += scale * ds * x.k[kv + d];
            dk[dkv + d] += scale * ds * q[d];
            dv[dkv + d] += p * dO[d];
          }
        }
      }
}

template <typename F>
void attention_cached_forward(F* out, const F* q, int ldq, const F* k_cache, const F* v_cache,
                              int p, int n, int C, int NH, int NKV) {
  const int hs = C / NH, CK = NKV * hs, group = NH / NKV;
  const F scale = F(1) / std::sqrt(F(hs));
  std::vector<F> w(p + n);
  for (int i = 0; i < n; i++)
    for (int h = 0; h < NH; h++) {
      const F* qi = q + (size_t)i * ldq + h * hs;
      const size_t kv = (size_t)(h / group) * hs;
      F mx = -INFINITY, sum = 0;
      for (int j = 0; j <= p + i; j++) {
        F s = 0;
        for (int d = 0; d < hs; d++) s += qi[d] * k_cache[(size_t)j * CK + kv + d];
        w[j] = s * scale;
        mx = std::max(mx, w[j]);
      }
      for (int j = 0; j <= p + i; j++) sum += (w[j] = std::exp(w[j] - mx));
      F* o = out + (size_t)i * C + h * hs;
      for (int d = 0; d < hs; d++) {
        F acc = 0;
        for (int j = 0; j <= p + i; j++) acc += w[j] * v_cache[(size_t)j * CK + kv + d];
        o[d] = acc / sum;
      }
    }
}

// ---- Llama-family parts (ops.h) ----

template <typename F>
void rmsnorm_forward(F* out, F* rstd, const F* inp, const F* weight, int N, int C, double eps) {
  for (int n = 0; n < N; n++) {
    const F* x = inp + (size_t)n * C;
    F ms = 0;
    for (int c = 0; c < C; c++) ms += x[c] * x[c];
    const F s = F(1) / std::sqrt(ms / C + F(eps));
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

template <typename F>
void rmsnorm_backward(F* dinp, F* dweight, const F* dout, const F* inp, const F* weight, const F* rstd,
                      int N, int C) {
  for (int n = 0; n < N; n++) {
    const F* x = inp + (size_t)n * C;
    const F* d = dout + (size_t)n * C;
    const F s = rstd[n];
    F dot = 0;  // sum_c weight * dout * x
    for (int c = 0; c < C; c++) dot += weight[c] * d[c] * x[c];
    for (int c = 0; c < C; c++) {
      dweight[c] += d[c] * x[c] * s;
      dinp[(size_t)n * C + c] += s * weight[c] * d[c] - s * s * s * x[c] * dot / C;
    }
  }
}

// Rotates x in place as kernels::rope_rotate, with the angles computed here from inv_freq.
template <typename F>
void rope_rotate(F* x, int N, int T, int ld, int heads, int hs, const double* inv_freq, int pos0, bool inverse,
                 const int* positions = nullptr) {
  const int half = hs / 2;
  for (int n = 0; n < N; n++)
    for (int h = 0; h < heads; h++) {
      F* r = x + (size_t)n * ld + (size_t)h * hs;
      for (int i = 0; i < half; i++) {
        const double angle = double(positions ? positions[n] : pos0 + n % T) * inv_freq[i];
        const F c = F(std::cos(angle)), s = F(inverse ? -std::sin(angle) : std::sin(angle));
        const F a = r[i], b = r[i + half];
        r[i] = a * c - b * s;
        r[i + half] = b * c + a * s;
      }
    }
}

template <typename F>
F silu(F x) {
  return x / (F(1) + std::exp(-x));
}

template <typename F>
void swiglu_forward(F* out, const F* inp, int N, int Fw) {
  for (int n = 0; n < N; n++)
    for (int f = 0; f < Fw; f++)
      out[(size_t)n * Fw + f] = silu(inp[(size_t)n * 2 * Fw + f]) * inp[(size_t)n * 2 * Fw + Fw + f];
}

template <typename F>
void swiglu_backward(F* dinp, const F* inp, const F* dout, int N, int Fw) {
  for (int n = 0; n < N; n++)
    for (int f = 0; f < Fw; f++) {
      const F g = inp[(size_t)n * 2 * Fw + f], u = inp[(size_t)n * 2 * Fw + Fw + f], d = dout[(size_t)n * Fw + f];
      const F sig = F(1) / (F(1) + std::exp(-g));
      dinp[(size_t)n * 2 * Fw + f] = d * u * (sig + g * sig * (F(1) - sig));
      dinp[(size_t)n * 2 * Fw + Fw + f] = d * g * sig;
    }
}

template <typename F>
F gelu(F x) {
  const F k = std::sqrt(F(2) / F(M_PI));
  return F(0.5) * x * (F(1) + std::tanh(k * (x + F(0.044715) * x * x * x)));
}

template <typename F>
void gelu_forward(F* out, const F* inp, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = gelu(inp[i]);
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n) {
  const F k = std::sqrt(F(2) / F(M_PI));
  for (size_t i = 0; i < n; i++) {
    F x = inp[i], u = k * (x + F(0.044715) * x * x * x), th = std::tanh(u);
    F du = k * (F(1) + F(3) * F(0.044715) * x * x);
    dinp[i] = dout[i] * (F(0.5) * (F(1) + th) + F(0.5) * x * (F(1) - th * th) * du);
  }
}

template <typename F>
void residual_forward(F* out, const F* a, const F* b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

template <typename F>
void crossentropy_forward(F* lse, F* target_logit, const F* logits, const int* targets, int N,
                          int vn, int ld, int vb) {
  for (int n = 0; n < N; n++) {
    const F* x = logits + (size_t)n * ld;
    const int t = targets[n] - vb;
    target_logit[n] = (t >= 0 && t < vn) ? x[t] : F(0);
    if (vn == 0) {
      lse[n] = -INFINITY;
      continue;
    }
    F mx = *std::max_element(x, x + vn), sum = 0;
    for (int v = 0; v < vn; v++) sum += std::exp(x[v] - mx);
    lse[n] = mx + std::log(sum);
  }
}

template <typename F>
void crossentropy_backward(F* dlogits, const F* logits, const F* lse, const int* targets, F dloss,
                           int N, int vn, int ld, int vb) {
  for (int n = 0; n < N; n++)
    for (int v = 0; v < vn; v++)
      dlogits[(size_t)n * ld + v] =
          (std::exp(logits[(size_t)n * ld + v] - lse[n]) - (v + vb == targets[n] ? F(1) : F(0))) *
          dloss;
}

template <typename F>
void bias_residual_forward(F* out, const F* residual, const F* x, const F* bias, int N, int C) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      out[(size_t)n * C + c] = residual[(size_t)n * C + c] + x[(size_t)n * C + c] + (bias ? bias[c] : F(0));
}

template <typename F>
void gemm(bool ta, bool tb, int M, int N, int K, F alpha, const F* A, int lda, const F* B, int ldb,
          F beta, F* C, int ldc) {
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      F acc = 0;
      for (int k = 0; k < K; k++)
        acc += (ta ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k]) *
               (tb ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n]);
      C[(size_t)m * ldc + n] = alpha * acc + (beta == F(0) ? F(0) : beta * C[(size_t)m * ldc + n]);
    }
}

}  // namespace meshtrain::kernels::ref
