// Scalar math written so that GCC vectorises it inside `#pragma omp simd` loops
// (libm's expf/tanhf do not vectorise without -ffast-math).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace meshtrain::kernels {

// exp(x) with ~2 ulp error: x = k*ln2 + r, exp(r) by a degree-7 polynomial (Cephes
// coefficients), scaled by 2^k built from the exponent bits.
inline float fast_exp(float x) {
  // Clamped with comparisons, not std::fmin/fmax: GCC calls libm for those (their NaN rules
  // differ from the min/max instructions), which stops vectorisation. NaN stays NaN.
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // floor(y) by conversion (y is in [-125, 128]): std::floor also ends up as a libm call.
  const float y = x * 1.44269504088896341f + 0.5f;
  const int32_t yi = static_cast<int32_t>(y);
  float k = static_cast<float>(yi - (y < static_cast<float>(yi)));
  float r = std::fma(k, -0.693359375f, x);
  r = std::fma(k, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r) + 1.0f;
  int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline float fast_tanh(float x) { return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f); }

// max(x[0..n)) (-inf when n = 0), in 16 lanes: GCC leaves a `reduction(max)` over std::max
// as a scalar chain of dependent vmaxss. The lanes' order does not change a maximum.
inline float row_max(const float* x, int n) {
  constexpr int kLanes = 16;
  float lane[kLanes];
  for (float& l : lane) l = -INFINITY;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  for (int j = 0; i < n; i++, j++) lane[j] = x[i] > lane[j] ? x[i] : lane[j];
  float mx = -INFINITY;
  for (float l : lane) mx = l > mx ? l : mx;
  return mx;
}

}  // namespace meshtrain::kernels
