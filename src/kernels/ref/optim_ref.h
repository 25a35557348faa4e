// Naive references for the optimizer's and the compressed collectives' ops (kernels/ops.h):
// plain loops over elements, the test oracle of kernels/cpu/adamw.cc, int8_blocks.cc and
// onebit.cc. Each computes what the op does in the same order and types, so the op must
// match it bit for bit. (dst += src is ops_ref.h's residual_forward(dst, dst, src).)
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace meshtrain::kernels::ref {

// torch's single-tensor AdamW on one element at a time (decay = 1 - lr * wd, or 1).
template <typename F>
void adamw_update(F* p, const F* g, F* m, F* v, size_t n, F b1, F b2, F eps, F step_size, F bias2_sqrt,
                  F decay) {
  for (size_t i = 0; i < n; i++) {
    const F decayed = p[i] * decay;
    m[i] = m[i] + (g[i] - m[i]) * (F(1) - b1);
    v[i] = v[i] * b2 + (F(1) - b2) * g[i] * g[i];
    const F denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    p[i] = decayed - step_size * m[i] / denom;
  }
}

template <typename F>
void adamw_preconditioned_update(F* p, const F* u, size_t n, F decay, F step_size) {
  for (size_t i = 0; i < n; i++) p[i] = p[i] * decay - step_size * u[i];
}

// The scale of every block first (max |x| / 127; NaN where a value is not finite), then
// each value's code from its block's peak.
inline void scale_inplace(float* x, size_t n, float factor) {
  for (size_t i = 0; i < n; i++) x[i] = x[i] * factor;
}

inline void quantize_int8(const float* x, size_t n, size_t block, uint8_t* out) {
  const size_t blocks = (n + block - 1) / block;
  std::vector<float> peak(blocks, 0.f);
  std::vector<bool> finite(blocks, true);
  for (size_t i = 0; i < n; i++) {
    peak[i / block] = std::max(peak[i / block], std::fabs(x[i]));
    if (!std::isfinite(x[i])) finite[i / block] = false;
  }
  for (size_t b = 0; b < blocks; b++) {
    const float scale = finite[b] ? peak[b] / 127.f : NAN;
    std::memcpy(out + b * sizeof(float), &scale, sizeof scale);
  }
  uint8_t* codes = out + blocks * sizeof(float);
  for (size_t i = 0; i < n; i++) {
    const size_t b = i / block;
    int8_t q = 0;
    if (finite[b] && peak[b] != 0.f) q = (int8_t)std::clamp(std::round(x[i] * (127.f / peak[b])), -127.f, 127.f);
    codes[i] = (uint8_t)q;
  }
}

inline void dequantize_int8(const uint8_t* in, size_t n, size_t block, float* out, bool accumulate) {
  const uint8_t* codes = in + (n + block - 1) / block * sizeof(float);
  for (size_t i = 0; i < n; i++) {
    float scale;
    std::memcpy(&scale, in + i / block * sizeof(float), sizeof scale);
    const float value = scale * (float)(int8_t)codes[i];
    out[i] = accumulate ? out[i] + value : value;
  }
}

// Element by element: the sign into its bit, then the error feedback.
inline void onebit_pack(float* error, size_t n, float scale, uint8_t* signs) {
  std::fill(signs, signs + (n + 7) / 8, 0);
  for (size_t i = 0; i < n; i++) {
    if (error[i] >= 0.f) {
      signs[i / 8] |= (uint8_t)(1u << (i % 8));
      error[i] -= scale;
    } else {
      error[i] -= -scale;
    }
  }
}

inline void onebit_unpack(const uint8_t* signs, size_t n, float scale, float* out, bool accumulate) {
  for (size_t i = 0; i < n; i++) {
    const float value = (signs[i / 8] >> (i % 8)) & 1u ? scale : -scale;
    out[i] = accumulate ? out[i] + value : value;
  }
}

}  // namespace meshtrain::kernels::ref
