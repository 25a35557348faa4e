// Linear layers on top of gemm(): weight is [OC, C] (PyTorch's nn.Linear layout).
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/memory.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

void matmul_forward(float* out, GemmInput inp, GemmInput weight, const float* bias, int N, int C,
                    int OC, Precision p) {
  gemm(p, false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, bias);
}

void matmul_backward(float* dinp, GradOutput dweight, float* dbias, const float* dout, GemmInput inp,
                     GemmInput weight, int N, int C, int OC, Precision p) {
  CHECK_MSG(!dweight.bf16 || p == Precision::kBf16, "a bf16 weight gradient needs bf16 GEMMs");
  GemmInput d(dout);
  if (p == Precision::kBf16) {  // one rounding of dout serves both GEMMs
    thread_local Buffer<uint16_t> dout16;
    if (dout16.size() < (size_t)N * OC) dout16.allocate(MemCategory::kWorkspace, (size_t)N * OC);
    to_bf16(dout, dout16.data(), (size_t)N * OC);
    d = GemmInput(dout16.data());
  }
  if (dinp) gemm(p, false, false, N, C, OC, 1.0f, d, OC, weight, C, 0.0f, dinp, C);
  matmul_backward_weight(dweight, d, inp, N, C, OC, p);
  if (dbias) {
    // Column ranges per thread: a fixed summation order whatever the thread count.
    constexpr int kChunk = 64;
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += kChunk) {
      int o1 = std::min(OC, o0 + kChunk);
      for (int n = 0; n < N; n++) {
        const float* d = dout + (size_t)n * OC;
#pragma omp simd
        for (int o = o0; o < o1; o++) dbias[o] += d[o];
      }
    }
  }
}

void matmul_backward_weight(GradOutput dweight, GemmInput dout, GemmInput inp, int N, int C, int OC, Precision p) {
  CHECK_MSG(!dweight.bf16 || p == Precision::kBf16, "a bf16 weight gradient needs bf16 GEMMs");
  if (dweight.bf16) gemm_accumulate_bf16(true, false, OC, C, N, dout, OC, inp, C, dweight.bf16, C);
  else if (dweight.fp32) gemm(p, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight.fp32, C);
}

GemmInput advanced(GemmInput x, size_t elements) {
  if (x.bf16) return GemmInput(x.bf16 + elements);
  return GemmInput(x.fp32 + elements);
}

// Groups run one after another, each GEMM on every thread: an expert's rows are few, its
// weight large, so splitting a GEMM is where the parallelism is.
void grouped_matmul_forward(float* out, GemmInput inp, const GemmInput* weights, const int* offsets, int groups,
                            int C, int OC, Precision p) {
  for (int g = 0; g < groups; g++) {
    const int rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    matmul_forward(out + (size_t)offsets[g] * OC, advanced(inp, (size_t)offsets[g] * C), weights[g], nullptr, rows,
                   C, OC, p);
  }
}

void grouped_matmul_backward(float* dinp, const GradOutput* dweights, const float* dout, GemmInput inp,
                             const GemmInput* weights, const int* offsets, int groups, int C, int OC,
                             Precision p) {
  for (int g = 0; g < groups; g++) {
    const int rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    const size_t first = offsets[g];
    matmul_backward(dinp ? dinp + first * C : nullptr, dweights[g], nullptr, dout + first * OC,
                    advanced(inp, first * C), weights[g], rows, C, OC, p);
  }
}

}  // namespace meshtrain::kernels
