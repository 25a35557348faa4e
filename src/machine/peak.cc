#include "machine/peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu_info.h"
#include "kernels/cpu/onednn.h"
#include "kernels/ops.h"

namespace meshtrain::machine {

namespace fs = std::filesystem;

namespace {

struct Shape {
  int M, N, K;
};
// A large square and the two GPT-2-124M MLP products at B*T = 2048 (C = 768, 4C = 3072):
// the engine's own GEMMs, where a square alone can rate a CPU low or high.
constexpr Shape kShapes[] = {{2048, 2048, 2048}, {2048, 3072, 768}, {2048, 768, 3072}};
constexpr int kRepetitions = 6;  // per shape, after one warm-up call

// Best GFLOP/s over the shapes and repetitions, C = A B^T with A, B of bf16 words or fp32.
double best_rate(int threads, bool bf16) {
  omp_set_num_threads(threads);
  double best = 0;
  for (const Shape& s : kShapes) {
    std::vector<float> a((size_t)s.M * s.K, 0.5f), b((size_t)s.N * s.K, 0.25f), c((size_t)s.M * s.N);
    std::vector<uint16_t> ha(bf16 ? a.size() : 0), hb(bf16 ? b.size() : 0);
    if (bf16) kernels::to_bf16(a.data(), ha.data(), a.size()), kernels::to_bf16(b.data(), hb.data(), b.size());
    for (int rep = 0; rep <= kRepetitions; rep++) {
      auto t0 = std::chrono::steady_clock::now();
      if (bf16)
        kernels::gemm_bf16(false, true, s.M, s.N, s.K, ha.data(), s.K, hb.data(), s.K, 0.0f, c.data(), s.N);
      else
        kernels::gemm(false, true, s.M, s.N, s.K, 1.0f, a.data(), s.K, b.data(), s.K, 0.0f, c.data(), s.N);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) best = std::max(best, 2.0 * s.M * s.N * (double)s.K / sec / 1e9);
    }
  }
  return best;
}

fs::path cache_file() {
  if (const char* d = std::getenv("MESHTRAIN_CACHE_DIR")) return fs::path(d) / "peak.json";
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/tmp") / ".cache" / "meshtrain" / "peak.json";
}

nlohmann::json read_cache() {
  nlohmann::json cache = nlohmann::json::object();
  std::ifstream in(cache_file());
  if (in) {
    try {
      in >> cache;
    } catch (...) {
      cache = nlohmann::json::object();  // a damaged cache is measured again
    }
  }
  return cache.is_object() ? cache : nlohmann::json::object();
}

}  // namespace

std::string peak_shapes() {
  std::string s;
  for (const Shape& sh : kShapes)
    s += (s.empty() ? "" : ", ") + std::to_string(sh.M) + "x" + std::to_string(sh.N) + "x" + std::to_string(sh.K);
  return s;
}

double measure_triad_gbps(int threads) {
  const size_t n = (size_t)32 << 20;
  // (Not std::vector: its value-initialization would touch every page on one thread.)
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(std::max(1, threads));
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;  // each page first touched by its thread
  double best = 0;
  for (int pass = 0; pass < 5; pass++) {
    const auto t0 = std::chrono::steady_clock::now();
    const float s = 3.0f + (float)pass;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 12.0 * (double)n / seconds / 1e9);
  }
  omp_set_num_threads(saved);
  // (a is read once more so that the passes are not dead stores.)
  return a[n / 2] > 0 ? best : 0;
}

double measure_gemm_peak_gflops(int threads, Precision p) {
  return best_rate(threads, kernels::peak_precision(p) == Precision::kBf16);
}

double measure_bf16_gemm_gflops(int threads) { return best_rate(threads, true); }

std::string peak_cache_key(int threads, Precision p) {
  return cpu_info().model + " | " + kernels::onednn_isa_name() + " | " +
         kernels::precision_name(kernels::peak_precision(p)) + " | " + std::to_string(threads) + " threads";
}

std::string peak_cache_path() { return cache_file().string(); }

void record_gemm_peak_gflops(int threads, double gflops, Precision p) {
  nlohmann::json cache = read_cache();
  const std::string key = peak_cache_key(threads, p);
  if (cache.contains(key) && cache[key].is_number() && cache[key].get<double>() >= gflops) return;
  cache[key] = gflops;
  const fs::path path = cache_file();
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  std::ofstream(path) << cache.dump(1) << "\n";
}

double cached_gemm_peak_gflops(int threads, bool verbose, Precision p) {
  nlohmann::json cache = read_cache();
  const std::string key = peak_cache_key(threads, p);
  if (cache.contains(key) && cache[key].is_number() && cache[key].get<double>() > 0)
    return cache[key].get<double>();
  if (verbose)
    std::fprintf(stderr, "measuring %s GEMM peak on %d threads (cached in %s)\n",
                 kernels::precision_name(kernels::peak_precision(p)), threads, cache_file().c_str());
  const double peak = measure_gemm_peak_gflops(threads, p);
  record_gemm_peak_gflops(threads, peak, p);
  return peak;
}

double honest_mfu(double achieved_gflops, double* peak_gflops, int threads, Precision p, bool measured,
                  bool* raised) {
  *raised = false;
  if (achieved_gflops > *peak_gflops) {
    const double again = measured ? measure_gemm_peak_gflops(threads, p) : 0.0;
    *peak_gflops = std::max({*peak_gflops, again, achieved_gflops});
    if (measured) record_gemm_peak_gflops(threads, *peak_gflops, p);
    *raised = true;
  }
  return *peak_gflops > 0 ? std::min(1.0, achieved_gflops / *peak_gflops) : 0.0;
}

}  // namespace meshtrain::machine
