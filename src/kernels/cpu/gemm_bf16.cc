// bf16 GEMMs: through oneDNN's matmul primitive (AMX or AVX512-BF16 kernels, fp32
// accumulation) where the CPU has bf16 units, otherwise on the fp32 GEMM with the operands
// widened (Bf16Backend in kernels/cpu/onednn.h). Primitives are created once per shape and
// layout and cached: creating one costs far more than running a small GEMM.
#include <dnnl.h>
#include <omp.h>

#include <atomic>

#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

#include "core/check.h"
#include "core/memory.h"
#include "kernels/cpu/onednn.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {

using dnnl::memory;

struct Matmul {
  dnnl::matmul primitive;
  memory::desc a, b, c, bias, scratchpad;
};

// One GEMM's shape and layout: op(A) is M x K, op(B) is K x N, both row-major storage with
// leading dimensions; C is fp32 or (c_bf16) bf16 words.
struct MatmulKey {
  bool ta, tb;
  int M, N, K, lda, ldb, ldc;
  bool accumulate, with_bias, c_bf16;
  auto operator<=>(const MatmulKey&) const = default;
};

struct MatmulCache {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<MatmulKey, Matmul> primitives;

  static MatmulCache& instance() {
    static MatmulCache cache;
    return cache;
  }

  Matmul get(const MatmulKey& k) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = primitives.find(k);
    if (it != primitives.end()) return it->second;
    const memory::desc a({k.M, k.K}, memory::data_type::bf16,
                         k.ta ? memory::dims{1, k.lda} : memory::dims{k.lda, 1});
    const memory::desc b({k.K, k.N}, memory::data_type::bf16,
                         k.tb ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1});
    const memory::desc c({k.M, k.N}, k.c_bf16 ? memory::data_type::bf16 : memory::data_type::f32,
                         memory::dims{k.ldc, 1});
    dnnl::primitive_attr attr;
    // The caller provides the scratchpad (packed operands): oneDNN would otherwise allocate
    // (and the kernel fault in) fresh pages on every call.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (k.accumulate) {  // C's values are added to the product in fp32, then C is written
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    // The bias is one fp32 row broadcast over the M rows of C.
    const memory::desc bias = k.with_bias ? memory::desc({1, k.N}, memory::data_type::f32, memory::dims{k.N, 1})
                                          : memory::desc();
    const auto desc = k.with_bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
    const dnnl::matmul::primitive_desc pd(desc, attr, engine);
    Matmul entry{dnnl::matmul(pd), a, b, c, bias, pd.scratchpad_desc()};
    primitives.emplace(k, entry);
    return entry;
  }
};

// Runs the cached primitive for `key` on A, B and C (fp32 or bf16 words), with the bias.
void run_matmul(const MatmulKey& key, const uint16_t* A, const uint16_t* B, void* C, const float* bias) {
  auto& cache = MatmulCache::instance();
  const Matmul mm = cache.get(key);
  memory a(mm.a, cache.engine, const_cast<uint16_t*>(A));
  memory b(mm.b, cache.engine, const_cast<uint16_t*>(B));
  memory c(mm.c, cache.engine, C);
  thread_local Buffer<uint8_t> scratch;  // reused: grows to the largest GEMM's need
  const size_t need = mm.scratchpad.get_size();
  if (scratch.size() < need) scratch.allocate(MemCategory::kWorkspace, need);
  memory pad(mm.scratchpad, cache.engine, scratch.data());
  dnnl::stream stream(cache.engine);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c},
                                        {DNNL_ARG_SCRATCHPAD, pad}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(mm.bias, cache.engine, const_cast<float*>(bias)));
  mm.primitive.execute(stream, args);
  stream.wait();
}

// Whether oneDNN runs bf16 matmuls on bf16 hardware here. Its effective ISA must include
// AVX512_BF16 (AMX's includes it): below that, oneDNN 2.x either has no bf16 matmul at all
// (AVX2: "could not create a primitive descriptor iterator") or emulates one slowly. A
// probe primitive is created as well, so a library that still refuses falls back too.
bool onednn_has_bf16() {
  const unsigned isa = dnnl_get_effective_cpu_isa();
  if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) return false;
  try {
    MatmulCache::instance().get({false, true, 16, 16, 16, 16, 16, 16, false, false, false});
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

std::atomic<int>& chosen_backend() {
  static std::atomic<int> backend{(int)(onednn_has_bf16() ? Bf16Backend::kOneDnn : Bf16Backend::kWidenedFp32)};
  return backend;
}

// Converts a rows x cols block (row stride ld) into a packed buffer, convert(src, dst, n)
// on each row (one call when the rows are contiguous). The conversions are elementwise.
template <typename Out, typename In, typename Convert>
const Out* packed(const In* x, int rows, int cols, int ld, Buffer<Out>& buf, Convert convert) {
  const size_t n = (size_t)rows * cols;
  if (buf.size() < n) buf.allocate(MemCategory::kWorkspace, n);
  if (ld == cols) {
    convert(x, buf.data(), n);
  } else {
    for (int r = 0; r < rows; r++) convert(x + (size_t)r * ld, buf.data() + (size_t)r * cols, (size_t)cols);
  }
  return buf.data();
}

// Widens a rows x cols block of bf16 words (row stride ld) into a packed fp32 buffer (exact).
const float* widened(const uint16_t* x, int rows, int cols, int ld, Buffer<float>& buf) {
  return packed(x, rows, cols, ld, buf, from_bf16);
}

// Seeds C[M,N] with beta * C + bias (bias may be null), so that a GEMM accumulates onto it.
void seed_with_bias(int M, int N, float beta, float* C, int ldc, const float* bias) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && (size_t)M * N >= 65536)
  for (int i = 0; i < M; i++) {
    float* row = C + (size_t)i * ldc;
    for (int j = 0; j < N; j++) row[j] = (beta == 0.0f ? 0.0f : beta * row[j]) + (bias ? bias[j] : 0.0f);
  }
}

// The bf16 GEMM without bf16 units: both operands widened to fp32 and multiplied by sgemm.
// A product of two bf16 values is exact in fp32 and the sums accumulate in fp32, as on the
// bf16 units, so this is the same bf16 arithmetic up to the order of the additions.
void widened_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
                       const uint16_t* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  thread_local Buffer<float> a_buf, b_buf;
  const int a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  const float* a = widened(A, trans_a ? K : M, a_cols, lda, a_buf);
  const float* b = widened(B, trans_b ? N : K, b_cols, ldb, b_buf);
  if (bias) seed_with_bias(M, N, beta, C, ldc, bias), beta = 1.0f;
  gemm(trans_a, trans_b, M, N, K, 1.0f, a, a_cols, b, b_cols, beta, C, ldc);
}

}  // namespace

Bf16Backend bf16_backend() { return (Bf16Backend)chosen_backend().load(); }

void force_bf16_backend(Bf16Backend b) {
  CHECK_MSG(b == Bf16Backend::kWidenedFp32 || onednn_has_bf16(),
            "force_bf16_backend: oneDNN has no bf16 matmul on this machine");
  chosen_backend().store((int)b);
}

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
               const uint16_t* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  if (M == 0 || N == 0) return;
  CHECK_MSG(beta == 0.0f || beta == 1.0f, "gemm_bf16: beta must be 0 or 1");
  if (K == 0) return seed_with_bias(M, N, beta, C, ldc, bias);
  if (bf16_backend() == Bf16Backend::kWidenedFp32)
    return widened_gemm_bf16(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
  run_matmul({trans_a, trans_b, M, N, K, lda, ldb, ldc, beta == 1.0f, bias != nullptr, false}, A, B, C,
             bias);
}

namespace {

// Rounds a rows x cols block (row stride ld) into a packed bf16 buffer.
const uint16_t* packed_bf16(const float* x, int rows, int cols, int ld, Buffer<uint16_t>& buf) {
  return packed(x, rows, cols, ld, buf, to_bf16);
}

// The same block rounded to fp16 values, kept as fp32 (packed).
const float* packed_fp16(const float* x, int rows, int cols, int ld, Buffer<float>& buf) {
  return packed(x, rows, cols, ld, buf, round_to_fp16);
}

// op(A) and op(B) of an M x N x K product as bf16 words with their leading dimensions: bf16
// inputs as they are, fp32 ones rounded into this thread's buffers (A is stored M x K, or
// K x M transposed; B is K x N, or N x K transposed).
struct Bf16Operands {
  const uint16_t *a, *b;
  int lda, ldb;
};
Bf16Operands as_bf16(bool trans_a, bool trans_b, int M, int N, int K, GemmInput A, int lda,
                     GemmInput B, int ldb) {
  thread_local Buffer<uint16_t> a_buf, b_buf;
  Bf16Operands o{A.bf16, B.bf16, lda, ldb};
  if (!o.a) o.lda = trans_a ? M : K, o.a = packed_bf16(A.fp32, trans_a ? K : M, o.lda, lda, a_buf);
  if (!o.b) o.ldb = trans_b ? K : N, o.b = packed_bf16(B.fp32, trans_b ? N : K, o.ldb, ldb, b_buf);
  return o;
}

}  // namespace

void gemm(Precision p, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          GemmInput A, int lda, GemmInput B, int ldb, float beta, float* C, int ldc,
          const float* bias) {
  CHECK_MSG(p == Precision::kBf16 || (A.fp32 && B.fp32), "a bf16 GEMM operand needs a bf16 GEMM");
  if (bias && p != Precision::kBf16) {
    // The fp32 GEMMs take no bias: seed C with beta * C + bias and accumulate onto it.
    seed_with_bias(M, N, beta, C, ldc, bias);
    beta = 1.0f;
  }
  if (p == Precision::kFp32) {
    gemm(trans_a, trans_b, M, N, K, alpha, A.fp32, lda, B.fp32, ldb, beta, C, ldc);
    return;
  }
  if (p == Precision::kFp16) {
    // The stored shapes: A is M x K (K x M transposed), B is K x N (N x K transposed).
    const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    thread_local Buffer<float> a_buf, b_buf;
    const float* a = packed_fp16(A.fp32, a_rows, a_cols, lda, a_buf);
    const float* b = packed_fp16(B.fp32, b_rows, b_cols, ldb, b_buf);
    gemm(trans_a, trans_b, M, N, K, alpha, a, a_cols, b, b_cols, beta, C, ldc);
    return;
  }
  CHECK_MSG(alpha == 1.0f, "bf16 gemm: alpha must be 1");
  const Bf16Operands o = as_bf16(trans_a, trans_b, M, N, K, A, lda, B, ldb);
  gemm_bf16(trans_a, trans_b, M, N, K, o.a, o.lda, o.b, o.ldb, beta, C, ldc, bias);
}

void gemm_accumulate_bf16(bool trans_a, bool trans_b, int M, int N, int K, GemmInput A, int lda,
                          GemmInput B, int ldb, uint16_t* C, int ldc) {
  if (M == 0 || N == 0 || K == 0) return;
  const Bf16Operands o = as_bf16(trans_a, trans_b, M, N, K, A, lda, B, ldb);
  if (bf16_backend() == Bf16Backend::kOneDnn) {
    run_matmul({trans_a, trans_b, M, N, K, o.lda, o.ldb, ldc, true, false, true}, o.a, o.b, C, nullptr);
    return;
  }
  // C's bf16 values widened, the product added in fp32, rounded once: what oneDNN's sum
  // post-op does.
  thread_local Buffer<float> c_buf;
  float* c = const_cast<float*>(widened(C, M, N, ldc, c_buf));
  widened_gemm_bf16(trans_a, trans_b, M, N, K, o.a, o.lda, o.b, o.ldb, 1.0f, c, N, nullptr);
  for (int r = 0; r < M; r++) to_bf16(c + (size_t)r * N, C + (size_t)r * ldc, N);
}

}  // namespace meshtrain::kernels
