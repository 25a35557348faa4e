// meshtrain_bench_attention: the causal attention kernels (forward + backward) on one
// layer's shapes, beside the machine's GEMM peak measured in the same run. The FLOPs counted
// are the causal ones (the products' lower triangle: 2 * 2 * B * NH * T^2/2 * hs forward,
// twice that backward), as `bench step --profile` counts them. Medians of 5 after a warmup.
// Flags: --threads N (all), --B 8, --T 256, --C 768, --NH 12, --NKV (NH), --precision bf16|fp32
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "machine/peak.h"

namespace {

int repeats = 5;
double median_s(const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < repeats; i++) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads(), B = 8, T = 256, C = 768, NH = 12, NKV = 0;
  std::string precision = "bf16";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (f == "--threads") threads = v;
    else if (f == "--B") B = v;
    else if (f == "--T") T = v;
    else if (f == "--C") C = v;
    else if (f == "--NH") NH = v;
    else if (f == "--NKV") NKV = v;
    else if (f == "--repeats") repeats = v;
    else if (f == "--precision") precision = argv[i + 1];
    else return std::fprintf(stderr, "unknown flag %s\n", f.c_str()), 2;
  }
  if (NKV == 0) NKV = NH;
  omp_set_num_threads(threads);
  namespace k = meshtrain::kernels;
  using meshtrain::kernels::Precision;
  const bool bf16 = precision == "bf16";
  const double peak = meshtrain::machine::measure_gemm_peak_gflops(threads, bf16 ? Precision::kBf16 : Precision::kFp32);
  const int hs = C / NH, width = C + 2 * NKV * hs;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> qkv((size_t)B * T * width), out((size_t)B * T * C), lse((size_t)B * NH * T);
  std::vector<float> dout(out.size()), dqkv(qkv.size());
  for (float& x : qkv) x = u(rng);
  for (float& x : dout) x = u(rng);
  const double fwd = median_s([&] {
    if (bf16) k::attention_forward_bf16(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV);
    else k::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV);
  });
  const double bwd = median_s([&] {
    if (bf16) k::attention_backward_bf16(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV);
    else k::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV);
  });
  const double flop_fwd = 2.0 * 2.0 * B * NH * (double)T * (T + 1) / 2 * hs;
  std::printf("attention %s B=%d T=%d C=%d NH=%d NKV=%d, %d threads; %s GEMM peak %.1f GFLOP/s (this run)\n",
              precision.c_str(), B, T, C, NH, NKV, threads, precision.c_str(), peak);
  std::printf("  forward  %8.2f ms %8.1f GFLOP/s %5.1f%% of peak\n", fwd * 1e3, flop_fwd / fwd * 1e-9,
              100 * flop_fwd / fwd * 1e-9 / peak);
  std::printf("  backward %8.2f ms %8.1f GFLOP/s %5.1f%% of peak\n", bwd * 1e3, 2 * flop_fwd / bwd * 1e-9,
              100 * 2 * flop_fwd / bwd * 1e-9 / peak);
  return 0;
}
