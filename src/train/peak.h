// The machine's measured GEMM peak at a precision (fp32 or bf16 operands), the denominator
// of MFU. Measured once per precision and thread count and cached in
// ~/.cache/meshtrain/peak.json (or $MESHTRAIN_CACHE_DIR).
#pragma once

#include "kernels/ops.h"

namespace meshtrain::train {

using kernels::Precision;

// Best GFLOP/s of a large square GEMM (2048^3) over a few repetitions on `threads` threads:
// sgemm for fp32 (and fp16, whose rounded operands the fp32 GEMM multiplies), the bf16
// matmul (operands already bf16) for bf16.
double measure_gemm_peak_gflops(int threads, Precision p = Precision::kFp32);
// Cached value, measuring (and caching) when absent.
double cached_gemm_peak_gflops(int threads, bool verbose, Precision p = Precision::kFp32);
// Records a measurement. The cache keeps the best value seen: a peak is a maximum, and a
// measurement taken while the machine was busy must not lower it.
void record_gemm_peak_gflops(int threads, double gflops, Precision p = Precision::kFp32);

}  // namespace meshtrain::train
