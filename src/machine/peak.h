// The machine's measured GEMM peak at a precision, the denominator of MFU, and the rule that
// keeps MFU honest. Measured per CPU model, oneDNN ISA, precision and thread count, and
// cached in ~/.cache/meshtrain/peak.json (or $MESHTRAIN_CACHE_DIR).
//
// The rule (docs/precision.md, "The peak"):
//  - a measurement is the best rate over several GEMM shapes like the engine's and several
//    repetitions of each, after a warm-up;
//  - the cache keeps the best measurement for its key: a peak is a maximum, and one taken
//    while other work loaded the cores must not lower it;
//  - a step whose achieved rate exceeds the peak proves the peak stale (measured on a busy
//    machine): the peak is measured again, raised to at least the achieved rate and
//    recorded, and the step is flagged. MFU never reads above 100%.
#pragma once
#include <string>

#include "kernels/ops.h"

namespace meshtrain::machine {

using kernels::Precision;

// Best GFLOP/s at precision p on `threads` threads: sgemm for fp32 and fp16 (whose rounded
// operands the fp32 GEMM multiplies), the bf16 GEMM for bf16 where bf16 has its own units,
// fp32's otherwise (kernels::peak_precision).
double measure_gemm_peak_gflops(int threads, Precision p = Precision::kFp32);
// The rate of the GEMM that kBf16 runs here, whatever backs it (for `bench peak`'s report).
double measure_bf16_gemm_gflops(int threads);
// Cached value, measuring (and caching) when absent.
double cached_gemm_peak_gflops(int threads, bool verbose, Precision p = Precision::kFp32);
// Records a measurement; the cache keeps the best value seen for the key.
void record_gemm_peak_gflops(int threads, double gflops, Precision p = Precision::kFp32);
// The cache key: CPU model, oneDNN ISA, peak precision, threads.
std::string peak_cache_key(int threads, Precision p);
std::string peak_cache_path();

// STREAM's triad (McCalpin), a[i] = b[i] + s * c[i] over three arrays of 32 Mi floats each
// (384 MiB, past any cache), on `threads` OpenMP threads: the best of 5 passes, in GB/s of the
// 12 bytes per element read and written (write-allocate traffic not counted, as STREAM
// counts it). The memory-bound ops of the step profile are set against it.
double measure_triad_gbps(int threads);

// The shapes measured, in words ("2048x2048x2048, 2048x3072x768, 2048x768x3072").
std::string peak_shapes();

// MFU of a step that achieved `achieved_gflops` against *peak_gflops, applying the rule
// above: when achieved exceeds the peak, *peak_gflops is raised to at least the achieved
// rate and *raised is set; a `measured` peak (not one the user gave with --peak-gflops) is
// first measured again on `threads` threads and the result recorded. The result is at most 1.
double honest_mfu(double achieved_gflops, double* peak_gflops, int threads, Precision p, bool measured,
                  bool* raised);

}  // namespace meshtrain::machine
