#include "train/peak.h"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"

namespace meshtrain::train {

namespace fs = std::filesystem;

namespace {
// fp16 operands are multiplied by the fp32 GEMM (kernels/ops.h), so its peak is fp32's.
Precision peak_precision(Precision p) { return p == Precision::kFp16 ? Precision::kFp32 : p; }
}  // namespace

double measure_gemm_peak_gflops(int threads, Precision p) {
  p = peak_precision(p);
  const int n = 2048;
  omp_set_num_threads(threads);
  std::vector<float> a((size_t)n * n, 0.5f), b((size_t)n * n, 0.25f), c((size_t)n * n);
  std::vector<uint16_t> ha((size_t)n * n), hb((size_t)n * n);
  kernels::to_bf16(a.data(), ha.data(), a.size());
  kernels::to_bf16(b.data(), hb.data(), b.size());
  double best = 0;
  for (int rep = 0; rep < 8; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    if (p == Precision::kBf16)
      kernels::gemm_bf16(false, true, n, n, n, ha.data(), n, hb.data(), n, 0.0f, c.data(), n);
    else
      kernels::gemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * n * n * (double)n / s / 1e9);  // rep 0 warms up
  }
  return best;
}

namespace {
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
      cache = nlohmann::json::object();
    }
  }
  return cache.is_object() ? cache : nlohmann::json::object();
}

std::string cache_key(int threads, Precision p) {
  return std::string(kernels::precision_name(p)) + "_threads_" + std::to_string(threads);
}

}  // namespace

void record_gemm_peak_gflops(int threads, double gflops, Precision p) {
  p = peak_precision(p);
  nlohmann::json cache = read_cache();
  const std::string key = cache_key(threads, p);
  if (cache.contains(key) && cache[key].is_number() && cache[key].get<double>() >= gflops) return;
  cache[key] = gflops;
  const fs::path path = cache_file();
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  std::ofstream(path) << cache.dump(1) << "\n";
}

double cached_gemm_peak_gflops(int threads, bool verbose, Precision p) {
  p = peak_precision(p);
  nlohmann::json cache = read_cache();
  const std::string key = cache_key(threads, p);
  if (cache.contains(key) && cache[key].is_number()) return cache[key].get<double>();
  if (verbose)
    std::fprintf(stderr, "measuring %s GEMM peak on %d threads (cached in %s)\n",
                 kernels::precision_name(p), threads, cache_file().c_str());
  double peak = measure_gemm_peak_gflops(threads, p);
  record_gemm_peak_gflops(threads, peak, p);
  return peak;
}

}  // namespace meshtrain::train
