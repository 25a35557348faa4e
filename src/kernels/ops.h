// The engine's operators, declared once. Each forward/backward pair takes its arguments in
// the same order (llm.c style). Shapes use fixed letters: B batch rows, T sequence, C model
// width, NH heads, hs = C/NH, V vocabulary, Vp padded vocabulary (row stride of logits),
// N = B*T rows.
//
// Gradient conventions (the model relies on them):
//   - parameter gradients (dweight, dbias, dwte, dwpe) are always accumulated (+=);
//   - layernorm_backward accumulates dinp (+=): it feeds the residual stream;
//   - every other dinp is overwritten (=).
// The optimised CPU kernels live in cpu/, the naive references (templated so that
// gradient checks run in double) in ref/ops_ref.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace meshtrain::kernels {

// The precision of a GEMM's operands. kBf16: fp32 operands are rounded to bfloat16 (round
// to nearest even) and multiplied with fp32 accumulation and an fp32 result, by the CPU's
// bf16 units where it has them, otherwise by the fp32 GEMM on the operands widened back to
// fp32 (on the CPU: kernels/cpu/onednn.h, Bf16Backend). kFp16: operands are rounded to
// IEEE half precision (nearest even; beyond 65504 they become inf, below 2^-24 zero),
// products accumulated in fp32: fp16 numerics, computed by the fp32 GEMM on the rounded
// values. Both emulations are exact in what they multiply: a product of two bf16
// or two fp16 values fits an fp32 mantissa, so only the order of the fp32 additions can
// differ from a native 16-bit unit.
enum class Precision { kFp32, kBf16, kFp16 };
const char* precision_name(Precision p);  // "fp32", "bf16", "fp16"
Status parse_precision(const std::string& name, Precision* out);

// Which kernel a GEMM at precision p runs, in words, for run headers and config.json.
const char* gemm_kernel_name(Precision p);
// The precision whose measured GEMM peak bounds a GEMM at p (the MFU denominator): fp32 for
// fp16, and for bf16 when it is widened to fp32.
Precision peak_precision(Precision p);

// out[B,T,C] = wte[inp[b,t] - vb, :] + wpe[t, :] where wte holds the vocabulary rows
// [vb, vb + vn) (a tensor-parallel rank's slice; all of it when tp = 1). Tokens outside
// the slice contribute zero; wpe may be null (added by one tp rank only). `positions` [B*T],
// when given, names each row's position instead of t (a document mask restarts them; a
// context-parallel rank's rows sit at their places in the whole sequence).
void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                     int C, int vb, int vn, const int* positions = nullptr);
// The same with wte in bfloat16 (16-bit weight storage): its rows are widened as they are read.
void encoder_forward(float* out, const int* inp, const uint16_t* wte, const float* wpe, int B,
                     int T, int C, int vb, int vn, const int* positions = nullptr);
// dwte rows of the slice and (when dwpe is not null) all of dwpe accumulate.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T,
                      int C, int vb, int vn, const int* positions = nullptr);

// out[N,C] = (inp - mean) * rstd * weight + bias, eps 1e-5; mean[N], rstd[N] kept for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// A GEMM operand: fp32 values, which a kBf16 or kFp16 GEMM rounds on every call, or values
// already in bfloat16 (16-bit stored weights, a tensor rounded once for two GEMMs), which
// only a kBf16 GEMM takes. Leading dimensions count elements either way.
struct GemmInput {
  const float* fp32 = nullptr;
  const uint16_t* bf16 = nullptr;
  GemmInput(const float* values) : fp32(values) {}
  explicit GemmInput(const uint16_t* bf16_values) : bf16(bf16_values) {}
};

// Where a GEMM adds a weight gradient: fp32 values (+=), or bf16 words (16-bit gradient
// storage), to which a kBf16 GEMM adds its product in fp32 and rounds once.
struct GradOutput {
  float* fp32 = nullptr;
  uint16_t* bf16 = nullptr;
  GradOutput(float* values) : fp32(values) {}
  explicit GradOutput(uint16_t* bf16_values) : bf16(bf16_values) {}
};

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC]   (bias may be null)
// Both GEMMs (and the backward's three) run at precision p; the bias and its gradient in
// fp32. At kBf16 the backward rounds dout once for both of its GEMMs.
void matmul_forward(float* out, GemmInput inp, GemmInput weight, const float* bias, int N, int C,
                    int OC, Precision p = Precision::kFp32);
// (Each output may be null: the input gradient alone, or the weight and bias gradients alone,
// is a zero-bubble schedule's B or W.)
void matmul_backward(float* dinp, GradOutput dweight, float* dbias, const float* dout, GemmInput inp,
                     GemmInput weight, int N, int C, int OC, Precision p = Precision::kFp32);
// The backward's weight GEMM alone, dweight += dout^T @ inp, from dout as the backward
// hands it to that GEMM (at kBf16 already rounded: a zero-bubble W keeps it so).
void matmul_backward_weight(GradOutput dweight, GemmInput dout, GemmInput inp, int N, int C, int OC,
                            Precision p = Precision::kFp32);

// The same forward in fp32 with each output element summed in one fixed order, whatever N,
// the thread count or the instruction set (cpu/matmul_rowwise.cc): a row's result does not
// depend on the rows beside it. Decoding uses it, so that a sequence batched with others
// gets the logits it gets alone, bit for bit. Slower than matmul_forward on many rows.
void matmul_forward_rowwise(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                            int OC);

// Grouped linear layers (a Mixture-of-Experts layer's experts), one call for every group:
// rows [offsets[g], offsets[g+1]) of inp [M,C] are multiplied by group g's weight [OC,C]
// (out rows = inp rows @ weights[g]^T). Backward: dinp rows (null: not wanted), and each
// group's weight gradient added into dweights[g]. A group without rows is skipped, its
// gradient left as it was.
void grouped_matmul_forward(float* out, GemmInput inp, const GemmInput* weights, const int* offsets, int groups,
                            int C, int OC, Precision p = Precision::kFp32);
void grouped_matmul_backward(float* dinp, const GradOutput* dweights, const float* dout, GemmInput inp,
                             const GemmInput* weights, const int* offsets, int groups, int C, int OC,
                             Precision p = Precision::kFp32);
// x advanced by `elements` values (fp32 or bf16 words, whichever it holds).
GemmInput advanced(GemmInput x, size_t elements);

// Causal self-attention with NH query heads sharing NKV key/value heads (NKV divides NH:
// NKV = NH multi-head, 1 < NKV < NH grouped-query, NKV = 1 multi-query attention). C = NH*hs.
// qkv[B,T,C+2*CK], CK = NKV*hs: q (C columns, head h at h*hs), k (CK columns), v (CK); query
// head h reads key/value head h / (NH/NKV). out[B,T,C]; lse[B,NH,T] is the log-sum-exp of
// each softmax row, all backward needs. Never materialises B*NH*T*T: works on blocks of
// query rows. At kBf16 the *_bf16 kernels below run; kFp16 keeps fp32 attention.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, int NKV,
                       Precision p = Precision::kFp32);
// dqkv[B,T,C+2*CK] overwritten; a key/value head's gradient sums over the heads sharing it.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH, int NKV,
                        Precision p = Precision::kFp32);
// The same with the four products on bf16 operands (q, k, v, the probabilities, dout and
// the score gradients rounded; fp32 accumulation, softmax and log-sum-exp in fp32): what
// --precision bf16 runs. One whole T x T product per head on the bf16 units.
void attention_forward_bf16(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, int NKV);
void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int B, int T, int C, int NH, int NKV);

// Inference with a KV cache: n new query rows at positions p..p+n-1 (q rows strided by
// ldq) attend to cached keys/values k_cache, v_cache [>= p+n, CK] (CK = NKV*C/NH, row
// stride CK), causally. out[n,C]. Equal to attention_forward's rows p..p+n-1 on the whole
// sequence.
void attention_cached_forward(float* out, const float* q, int ldq, const float* k_cache,
                              const float* v_cache, int p, int n, int C, int NH, int NKV);

// ---- Attention by key ranges: document masks and context parallelism (docs/long_context.md) ----
// Query rows against a block of key/value rows, query row i of batch row b seeing the
// block's keys [lo[b*n+i], hi[b*n+i]) (an empty range sees none). A causal mask, a
// document mask and a ring step's block of another rank's keys are all such ranges, because
// a row's visible keys are contiguous: from its document's first token to itself.
struct AttentionBlock {
  const float* q;  // [B, n, ldq]: query head h at column h*hs
  int ldq;
  const float *k, *v;  // [B, m, ldkv] each: key/value head g at column g*hs
  int ldkv;
  int B, n, m, NH, NKV, hs;
  const int *lo, *hi;  // [B*n]
};
// out[B, n, ldo] (head h at h*hs) and lse[B, NH, n] over the visible keys; a row that sees
// none gets out 0 and lse -inf. Works on blocks of query rows: a thread's scores are at
// most 64 x m floats, never n x m per head.
void attention_ranged_forward(float* out, int ldo, float* lse, const AttentionBlock& x);
// Adds to dq [B,n,lddq] and dk, dv [B,m,lddkv] (never overwrites) the gradient of the
// rows' final output `out` (lse its final log-sum-exp) through this block's keys: the
// whole gradient when the block holds every key, a ring step's share otherwise.
void attention_ranged_backward(float* dq, int lddq, float* dk, float* dv, int lddkv, const float* dout,
                               const float* out, int ldo, const float* lse, const AttentionBlock& x);
// Folds a partial result over more keys (out_part [B,n,ld], lse_part [B,NH,n]) into a
// running one (out, lse), weighting each by its share exp(lse_x - lse_new) of the new
// softmax sum. Either side may have seen no keys (lse -inf).
void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part, int B, int n,
                     int NH, int hs, int ld);

// ---- Llama-family parts ----

// RMSNorm (Zhang & Sennrich 2019): out[N,C] = inp * rstd * weight, rstd[N] = 1/sqrt(mean(inp^2)
// + eps), kept for backward. No mean subtraction, no bias.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps);
// dinp accumulates (+=), as layernorm_backward's: it feeds the residual stream; dweight too.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

// Llama 3's rotary frequency scaling (factor 0: none). Wavelengths longer than
// original_positions / low_freq_factor are stretched by `factor`, shorter than
// original_positions / high_freq_factor kept, and those between interpolated.
struct RopeScaling {
  double factor = 0, low_freq_factor = 1, high_freq_factor = 4;
  int original_positions = 8192;
};
// Rotary position embedding (Su et al. 2021) in Hugging Face's half-split layout: in a head
// of hs columns, column i < hs/2 pairs with column i + hs/2, and the pair turns by the angle
// position * inv_freq[i], inv_freq[i] = theta^(-2i/hs) (scaled as above). rope_table fills
// cos and sin [positions, hs/2] (computed in double).
void rope_inverse_frequencies(double* inv_freq, int hs, double theta, const RopeScaling& scaling);
void rope_table(float* cos, float* sin, int positions, int hs, double theta, const RopeScaling& scaling);
// Turns x in place: row n (n < N) is at position pos0 + n % T, or positions[n] when given,
// and holds `heads` heads of hs columns from x + n * ld. inverse turns by the opposite
// angles: the rotation is orthogonal, so that is its backward (dx_in = R^T dx_out).
void rope_rotate(float* x, int N, int T, int ld, int heads, int hs, const float* cos, const float* sin,
                 int pos0, bool inverse, const int* positions = nullptr);

// SwiGLU (Shazeer 2020): out[N,F] = silu(gate) * up for inp[N,2F] = [gate | up] per row,
// silu(g) = g * sigmoid(g). The bf16 form rounds its output, as gelu_forward's.
void swiglu_forward(float* out, const float* inp, int N, int F);
void swiglu_forward(uint16_t* out, const float* inp, int N, int F);
// dinp[N,2F] = [dgate | dup] (overwritten).
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F);

// GELU, tanh approximation.
void gelu_forward(float* out, const float* inp, size_t n);
// The same rounded to bfloat16 (to nearest even): the output of a bf16 run's MLP feeds only
// the bf16 GEMMs of fc_proj, which would round it anyway.
void gelu_forward(uint16_t* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

void residual_forward(float* out, const float* a, const float* b, size_t n);
// out[N,C] = residual + x + bias (bias may be null): a row-parallel linear's bias is added
// once, after the partial outputs are summed.
void bias_residual_forward(float* out, const float* residual, const float* x, const float* bias,
                           int N, int C);

// Dropout in place on x[rows, C] with keep probability 1-p and scale 1/(1-p). Whether
// element (r, c) is kept depends only on (key, row0 + r, c) through a counter-based hash,
// so every layout that holds that token row (any tp/sp/dp split, a recomputation, the
// backward pass applying the same mask to a gradient) draws the same decision.
void dropout_forward(float* x, int rows, int C, float p, uint64_t key, int64_t row0);
bool dropout_keep(uint64_t key, int64_t row, int col, float p);

// Cross-entropy pieces over a slice of the vocabulary: logits[N, ld] holds columns for the
// token ids [vb, vb + vn) (vn real columns; the rest of the row stride is padding, never
// read or written). lse[N] = log-sum-exp of the row's vn columns (-inf when vn = 0),
// target_logit[N] = the target's logit when the target is in the slice, else 0. One rank
// (tp = 1): loss = lse - target_logit. Vocabulary-parallel ranks combine their pieces.
void crossentropy_forward(float* lse, float* target_logit, const float* logits,
                          const int* targets, int N, int vn, int ld, int vb);
// dlogits = (exp(logits - lse) - onehot(target - vb)) * dloss over the vn columns, with the
// global lse. dlogits may alias logits.
void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int* targets, float dloss, int N, int vn, int ld, int vb);
// The same gradient rounded to bfloat16 and written in place over the logits: row n's vn
// words start where row n's floats start (the bf16 row stride is 2 * ld), so a bf16 head
// backward reads half the bytes and rounds nothing again. Equal to crossentropy_backward
// followed by to_bf16.
uint16_t* crossentropy_backward_bf16_inplace(float* logits, const float* lse, const int* targets,
                                             float dloss, int N, int vn, int ld, int vb);

// Row-major GEMM: C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

// ---- mixed precision ----

// bfloat16 as its 16 bits: the upper half of an IEEE fp32.
void to_bf16(const float* x, uint16_t* out, size_t n);  // round to nearest even; NaN stays NaN
void from_bf16(const uint16_t* x, float* out, size_t n);
// x rounded to the nearest IEEE half (ties to even, overflow to inf), returned as fp32.
void round_to_fp16(const float* x, float* out, size_t n);
// Half-precision storage as 16-bit words in format p (kBf16 or kFp16), rounded to nearest
// even; from_half is exact.
void to_half(Precision p, const float* x, uint16_t* out, size_t n);
void from_half(Precision p, const uint16_t* x, float* out, size_t n);
// dst = half(float(dst) + src): the sum in fp32, rounded once (gradient accumulation).
void add_to_half(Precision p, uint16_t* dst, const float* src, size_t n);
// C[M,N] = op(A) @ op(B) + bias + beta * C with bf16 operands, fp32 accumulation; beta is 0
// or 1; bias[N] (fp32, added to every row) may be null.
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda,
               const uint16_t* B, int ldb, float beta, float* C, int ldc,
               const float* bias = nullptr);
// C[M,N] (bf16 words) = bf16(op(A) @ op(B) + C): a bf16 GEMM (fp32 operands rounded first)
// whose product is added to C's values in fp32 and rounded once, as add_to_half would add
// an fp32 result.
void gemm_accumulate_bf16(bool trans_a, bool trans_b, int M, int N, int K, GemmInput A, int lda,
                          GemmInput B, int ldb, uint16_t* C, int ldc);
// gemm() at precision p, plus bias[N] on every row when given. kBf16 and kFp16 round fp32
// operands op(A) and op(B) into a tracked workspace first (bf16 operands are used as they
// are); kBf16 needs alpha = 1 and beta in {0, 1}.
void gemm(Precision p, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          GemmInput A, int lda, GemmInput B, int ldb, float beta, float* C, int ldc,
          const float* bias = nullptr);

// ---- optimizer updates and compressed communication ----

// One AdamW step's scalars in torch's single-tensor AdamW form (optim/adamw.cc computes
// them): step_size = lr / (1 - b1^t), bias2_sqrt = sqrt(1 - b2^t), decay = 1 - lr * wd for
// a tensor with weight decay and 1 for one without.
struct AdamWScalars {
  float b1, b2, eps, step_size, bias2_sqrt, decay;
};
// For each of n elements, in this order and in fp32 (torch's order of operations):
//   m = m + (g - m) * (1 - b1);  v = v * b2 + (1 - b2) * g * g;
//   p = p * decay - step_size * m / (sqrt(v) / bias2_sqrt + eps).
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWScalars& s);
// x[i] *= factor (gradient clipping's multiplication, on the way into the update).
void scale_inplace(float* x, size_t n, float factor);
// A 16-bit run's whole update in one pass (--precision bf16 and fp16): the gradients g16
// widened and multiplied by grad_coef (the loss-scale and clip factor; 1: no product), the
// fp32 master weights w and the moments updated as adamw_update does, and the 16-bit weights
// p16 rounded from the new w. Bit for bit what from_half, scale_inplace, adamw_update and
// to_half give in turn, at 1.7x their speed: the separate passes cost more in their calls
// than in their memory traffic (docs/performance.md).
void adamw_update_half(Precision p, const uint16_t* g16, float grad_coef, float* w, float* m, float* v,
                       uint16_t* p16, size_t n, const AdamWScalars& s);
// 1-bit Adam's compressed phase, where u is the momentum already divided by the frozen
// denominator: p = p * decay - step_size * u.
void adamw_preconditioned_update(float* p, const float* u, size_t n, float decay, float step_size);

// Block-wise symmetric int8 quantization (the quantized collectives' wire format,
// compress/int8_blocks.h): n values in blocks of `block` (the last may be shorter), each
// with an fp32 scale s = max|x| / 127 and codes q = round(x / s) (ties away from zero,
// computed as x * (127 / max|x|)). out holds the ceil(n / block) scales, then the n codes.
// A block of zeros has s = 0; a non-finite value gives its block a NaN scale and zero codes.
void quantize_int8(const float* x, size_t n, size_t block, uint8_t* out);
// out[i] = s * q of element i (+= with accumulate).
void dequantize_int8(const uint8_t* in, size_t n, size_t block, float* out, bool accumulate = false);

// dst[i] += src[i] (1-bit compression's error feedback adds the values to the error).
void add_inplace(float* dst, const float* src, size_t n);
// 1-bit compression's signs (compress/onebit.h): bit i % 8 of signs[i / 8] is set where
// error[i] >= 0, and error[i] keeps what the block leaves out: it loses +scale there and
// -scale elsewhere.
void onebit_pack(float* error, size_t n, float scale, uint8_t* signs);
// out[i] = +scale where bit i is set, else -scale (+= with accumulate).
void onebit_unpack(const uint8_t* signs, size_t n, float scale, float* out, bool accumulate = false);

}  // namespace meshtrain::kernels
