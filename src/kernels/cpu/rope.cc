// Rotary position embedding: the tables in double (then rounded once), the rotation in
// fp32 over precomputed cos/sin rows.
#include <cmath>
#include <numbers>
#include <vector>

#include "kernels/ops.h"

namespace meshtrain::kernels {

void rope_inverse_frequencies(double* inv_freq, int hs, double theta, const RopeScaling& scaling) {
  const int half = hs / 2;
  for (int i = 0; i < half; i++) inv_freq[i] = std::pow(theta, -2.0 * i / hs);
  if (scaling.factor <= 0) return;
  // Llama 3 (as Meta's reference and Hugging Face's "llama3" rope type compute it).
  const double low_wavelen = scaling.original_positions / scaling.low_freq_factor;
  const double high_wavelen = scaling.original_positions / scaling.high_freq_factor;
  for (int i = 0; i < half; i++) {
    const double f = inv_freq[i], wavelen = 2 * std::numbers::pi / f;
    if (wavelen < high_wavelen) continue;  // high frequencies: kept
    if (wavelen > low_wavelen) {           // low frequencies: stretched
      inv_freq[i] = f / scaling.factor;
      continue;
    }
    const double smooth = (scaling.original_positions / wavelen - scaling.low_freq_factor) /
                          (scaling.high_freq_factor - scaling.low_freq_factor);
    inv_freq[i] = (1 - smooth) * f / scaling.factor + smooth * f;
  }
}

void rope_table(float* cos, float* sin, int positions, int hs, double theta, const RopeScaling& scaling) {
  const int half = hs / 2;
  std::vector<double> inv_freq(half);
  rope_inverse_frequencies(inv_freq.data(), hs, theta, scaling);
  for (int t = 0; t < positions; t++)
    for (int i = 0; i < half; i++) {
      const double angle = (double)t * inv_freq[i];
      cos[(size_t)t * half + i] = (float)std::cos(angle);
      sin[(size_t)t * half + i] = (float)std::sin(angle);
    }
}

void rope_rotate(float* x, int N, int T, int ld, int heads, int hs, const float* cos, const float* sin,
                 int pos0, bool inverse, const int* positions) {
  const int half = hs / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const size_t pos = positions ? (size_t)positions[n] : (size_t)(pos0 + n % T);
    const float* c = cos + pos * half;
    const float* s = sin + pos * half;
    for (int h = 0; h < heads; h++) {
      float* a = x + (size_t)n * ld + (size_t)h * hs;
      float* b = a + half;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        const float ai = a[i], bi = b[i], si = sign * s[i];
        a[i] = ai * c[i] - bi * si;
        b[i] = bi * c[i] + ai * si;
      }
    }
  }
}

}  // namespace meshtrain::kernels
