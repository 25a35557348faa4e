// meshtrain_bench_compress: the compute the compressors add (src/compress/), beside this
// machine's measured memory copy rate, and what they save on a link.
//   1-bit: compress_onebit (x + error -> signs, RMS scale, new error) and decompress_onebit
//          over E floats, in ns per element and GB/s of fp32 input;
//   int8:  quantize_int8 (blocks of 256: the peak, the codes) and dequantize_int8 over E
//          floats, ZeRO++'s qwZ and qgZ (parallel/dp/quantized_comm.h);
//   PowerSGD: one reduce() of a rows x cols matrix at rank r on one rank (its GEMMs and
//          Gram-Schmidt; the all-reduces are of size zero here), in ms;
// then, for a link of L GB/s (default 0.121, the 1 Gbit/s namespace link of bench/README.md),
// the time an fp32 all-reduce of the matrix between 2 ranks takes and what the compressed one
// takes with its compute added. Medians of 7 runs after one warmup.
// Flags: --elements E (16777216) --rows R (768) --cols C (3072) --rank r (4) --link-gbs L
//        --threads T (1)
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

#include "comm/self_group.h"
#include "compress/int8_blocks.h"
#include "compress/onebit.h"
#include "compress/powersgd.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median_s(const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < 7; i++) {
    const double t0 = now_s();
    f();
    t.push_back(now_s() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t elements = size_t{1} << 24;
  int rows = 768, cols = 3072, rank = 4, threads = 1;
  double link_gbs = 0.121;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--elements") elements = std::strtoull(v, nullptr, 10);
    else if (k == "--rows") rows = std::atoi(v);
    else if (k == "--cols") cols = std::atoi(v);
    else if (k == "--rank") rank = std::atoi(v);
    else if (k == "--link-gbs") link_gbs = std::atof(v);
    else if (k == "--threads") threads = std::atoi(v);
    else {
      std::fprintf(stderr, "usage: see the comment at the top of bench/compress_cost.cc\n");
      return 2;
    }
  }
  if (argc % 2 == 0 || elements == 0 || rows < 1 || cols < 1 || rank < 1 || threads < 1 || !(link_gbs > 0)) {
    std::fprintf(stderr, "usage: see the comment at the top of bench/compress_cost.cc\n");
    return 2;
  }
  omp_set_num_threads(threads);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(elements), error(elements, 0.f), out(elements);
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> block(meshtrain::compress::onebit_block_bytes(elements));

  // The machine's copy rate: read and write E floats.
  const double copy = median_s([&] { std::memcpy(out.data(), x.data(), elements * sizeof(float)); });
  const double copy_gbs = 2.0 * elements * sizeof(float) / copy / 1e9;
  const double enc = median_s([&] { meshtrain::compress::compress_onebit(x.data(), error.data(), elements, block.data()); });
  const double dec = median_s([&] { meshtrain::compress::decompress_onebit(block.data(), elements, out.data()); });
  std::printf("# %d threads; memory copy (read + write) %.1f GB/s\n", threads, copy_gbs);
  std::printf("1-bit compress   %zu floats: %7.2f ms, %5.2f ns/element, %6.1f GB/s of fp32 input (copy: %.1f)\n",
              elements, enc * 1e3, enc * 1e9 / elements, elements * 4.0 / enc / 1e9, copy_gbs);
  std::printf("1-bit decompress %zu floats: %7.2f ms, %5.2f ns/element, %6.1f GB/s of fp32 output\n", elements, dec * 1e3,
              dec * 1e9 / elements, elements * 4.0 / dec / 1e9);

  std::vector<uint8_t> int8(meshtrain::compress::int8_bytes(elements, 256));
  const double q8 = median_s([&] { meshtrain::compress::quantize_int8(x.data(), elements, 256, int8.data()); });
  const double d8 = median_s([&] { meshtrain::compress::dequantize_int8(int8.data(), elements, 256, out.data()); });
  std::printf("int8 quantize    %zu floats: %7.2f ms, %5.2f ns/element, %6.1f GB/s of fp32 input\n", elements, q8 * 1e3,
              q8 * 1e9 / elements, elements * 4.0 / q8 / 1e9);
  std::printf("int8 dequantize  %zu floats: %7.2f ms, %5.2f ns/element, %6.1f GB/s of fp32 output\n", elements, d8 * 1e3,
              d8 * 1e9 / elements, elements * 4.0 / d8 / 1e9);

  // PowerSGD on one matrix, on one rank: its compute alone.
  const size_t n = (size_t)rows * cols;
  std::vector<float> grad(n), work(n), perr(n, 0.f);
  for (float& v : grad) v = normal(rng);
  meshtrain::comm::SelfGroup self("dp");
  meshtrain::compress::PowerSgd psgd(self, n, {{0, rows, cols}}, rank, 3);
  const double ps = median_s([&] {
    std::memcpy(work.data(), grad.data(), n * sizeof(float));
    psgd.reduce(work.data(), perr.data());
  });
  std::printf("PowerSGD reduce  %d x %d at rank %d: %7.2f ms of compute\n", rows, cols, rank, ps * 1e3);

  // Two ranks over a link of link_gbs: fp32 all-reduce bytes (2 (N-1)/N x 4 n = 4 n per rank)
  // against each compressor's, plus its compute.
  const double fp32_s = 4.0 * n / (link_gbs * 1e9);
  const double onebit_bytes = 2.0 * (double)meshtrain::compress::onebit_block_bytes(n / 2);
  // Per rank of 2: the worker compresses n, the server decompresses 2 blocks of n/2 and
  // compresses n/2, and every rank decompresses the 2 server blocks (n).
  const double onebit_compute = (1.5 * enc + 2 * dec) * (double)n / elements;
  const double psgd_bytes = 4.0 * rank * (rows + cols);
  std::printf("link %.3f GB/s, 2 ranks, the %d x %d matrix: fp32 all-reduce %.1f ms; 1-bit %.1f ms on the wire + %.1f ms "
              "compute; PowerSGD r=%d %.2f ms on the wire + %.1f ms compute\n",
              link_gbs, rows, cols, fp32_s * 1e3, onebit_bytes / (link_gbs * 1e9) * 1e3, onebit_compute * 1e3, rank,
              psgd_bytes / (link_gbs * 1e9) * 1e3, ps * 1e3);
  return 0;
}
