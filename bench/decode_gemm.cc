// meshtrain_bench_decode: the decoder's linear layer (matmul_forward_rowwise: one summation
// order whatever the rows, so batched sequences get their alone logits bit for bit) against
// oneDNN's sgemm (matmul_forward: faster on many rows, but a row's rounding depends on the
// rows beside it), on GPT-2 small's shapes: qkv (768 -> 2304), fc (768 -> 3072), fc_proj
// (3072 -> 768). For each number of rows M: GFLOP/s of both, and the weight bytes read per
// second (a decode step reads every weight once), beside the machine's measured GEMM peak.
// Medians of 7 runs after one warmup.
// Flags: --threads T (1)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "machine/peak.h"

namespace {

double median_s(const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < 7; i++) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[3];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  omp_set_num_threads(threads);
  namespace k = meshtrain::kernels;
  std::printf("fp32 GEMM peak here: %.1f GFLOP/s on %d thread(s)\n", meshtrain::machine::measure_gemm_peak_gflops(threads),
              threads);
  std::printf("%-8s %5s %14s %14s %10s %12s\n", "layer", "M", "rowwise GF/s", "oneDNN GF/s", "ratio", "rowwise GB/s");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  const struct { const char* name; int C, OC; } layers[] = {{"qkv", 768, 2304}, {"fc", 768, 3072}, {"fc_proj", 3072, 768}};
  for (const auto& l : layers) {
    std::vector<float> w((size_t)l.OC * l.C), b(l.OC);
    for (float& x : w) x = u(rng);
    for (float& x : b) x = u(rng);
    for (int M : {1, 2, 4, 8, 16, 64, 256}) {
      std::vector<float> x((size_t)M * l.C), out((size_t)M * l.OC);
      for (float& v : x) v = u(rng);
      const double flop = 2.0 * M * l.C * l.OC;
      const double rowwise = median_s([&] { k::matmul_forward_rowwise(out.data(), x.data(), w.data(), b.data(), M, l.C, l.OC); });
      const double onednn = median_s([&] { k::matmul_forward(out.data(), x.data(), w.data(), b.data(), M, l.C, l.OC); });
      std::printf("%-8s %5d %14.1f %14.1f %10.2f %12.1f\n", l.name, M, flop / rowwise * 1e-9, flop / onednn * 1e-9,
                  onednn / rowwise, w.size() * 4.0 / rowwise * 1e-9);
    }
  }
  return 0;
}
