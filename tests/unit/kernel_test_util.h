// Helpers shared by the kernel tests: random data, finite-difference gradient checks in
// double, and the relative difference the kernel-vs-reference comparisons bound.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace meshtrain::kernels::test_util {

using Vec = std::vector<double>;

inline Vec random_vec(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> to_float(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// Checks analytic[i] == d loss / d x[i] by central differences on up to 30 indices.
inline void expect_gradient(Vec& x, const Vec& analytic, const std::function<double()>& loss,
                     const char* what) {
  ASSERT_EQ(x.size(), analytic.size());
  const double h = 1e-6;
  std::mt19937 rng(7);
  size_t samples = std::min<size_t>(30, x.size());
  for (size_t s = 0; s < samples; s++) {
    size_t i = samples == x.size() ? s : rng() % x.size();
    double saved = x[i];
    x[i] = saved + h;
    double lp = loss();
    x[i] = saved - h;
    double lm = loss();
    x[i] = saved;
    double numeric = (lp - lm) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, 1e-6 * (1 + std::abs(numeric))) << what << " index " << i;
  }
}

// Largest |a - b| relative to the largest |b|.
inline double max_rel_diff(const std::vector<float>& a, const Vec& b) {
  double diff = 0, mag = 1e-30;
  for (size_t i = 0; i < b.size(); i++) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    mag = std::max(mag, std::abs(b[i]));
  }
  return diff / mag;
}

}  // namespace meshtrain::kernels::test_util
