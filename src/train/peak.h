// The machine's measured fp32 GEMM peak, the denominator of MFU. Measured once per thread
// count and cached in ~/.cache/meshtrain/peak.json (or $MESHTRAIN_CACHE_DIR).
#pragma once

namespace meshtrain::train {

// Best GFLOP/s of a large square sgemm over a few repetitions on `threads` threads.
double measure_gemm_peak_gflops(int threads);
// Cached value for `threads`, measuring (and caching) when absent.
double cached_gemm_peak_gflops(int threads, bool verbose);
// Records a measurement. The cache keeps the best value seen: a peak is a maximum, and a
// measurement taken while the machine was busy must not lower it.
void record_gemm_peak_gflops(int threads, double gflops);

}  // namespace meshtrain::train
