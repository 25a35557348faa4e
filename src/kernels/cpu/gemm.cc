// GEMM through oneDNN's BLAS-like sgemm (JIT AVX-512 kernels). Inside an OpenMP parallel
// region oneDNN runs single-threaded, which is what the attention kernel wants.
#include <dnnl.h>

#include "core/check.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda,
                                B, ldb, beta, C, ldc);
  CHECK_MSG(st == dnnl_success, "dnnl_sgemm failed");
}

}  // namespace meshtrain::kernels
