// Kernel tests: (1) the naive references against central finite differences in double;
// (2) the optimised CPU kernels against the references on random shapes, odd sizes included.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <string>
#include <cmath>
#include <functional>
#include <random>
#include <tuple>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/fp16.h"
#include "kernels/cpu/onednn.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"

namespace meshtrain::kernels::test_kernels {
namespace {

using namespace test_util;
using Vec = test_util::Vec;

TEST(GradCheck, Encoder) {
  std::mt19937 rng(1);
  const int B = 2, T = 3, C = 5, V = 7;
  std::vector<int> inp = {1, 3, 3, 0, 6, 1};
  Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), w = random_vec(B * T * C, rng);
  Vec out(B * T * C);
  auto loss = [&] {
    ref::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C, 0, V);
    return dot(out, w);
  };
  Vec dwte(V * C), dwpe(T * C);
  ref::encoder_backward(dwte.data(), dwpe.data(), w.data(), inp.data(), B, T, C, 0, V);
  expect_gradient(wte, dwte, loss, "wte");
  expect_gradient(wpe, dwpe, loss, "wpe");
}

TEST(GradCheck, LayerNorm) {
  std::mt19937 rng(2);
  const int N = 4, C = 7;
  Vec x = random_vec(N * C, rng), g = random_vec(C, rng), b = random_vec(C, rng),
      w = random_vec(N * C, rng);
  Vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), N, C);
    return dot(out, w);
  };
  loss();
  Vec dx(N * C), dg(C), db(C);
  ref::layernorm_backward(dx.data(), dg.data(), db.data(), w.data(), x.data(), g.data(), mean.data(),
                          rstd.data(), N, C);
  expect_gradient(x, dx, loss, "inp");
  expect_gradient(g, dg, loss, "weight");
  expect_gradient(b, db, loss, "bias");
}

TEST(GradCheck, Matmul) {
  std::mt19937 rng(3);
  const int N = 5, C = 6, OC = 4;
  Vec x = random_vec(N * C, rng), W = random_vec(OC * C, rng), b = random_vec(OC, rng),
      w = random_vec(N * OC, rng);
  Vec out(N * OC);
  auto loss = [&] {
    ref::matmul_forward(out.data(), x.data(), W.data(), b.data(), N, C, OC);
    return dot(out, w);
  };
  Vec dx(N * C), dW(OC * C), db(OC);
  ref::matmul_backward(dx.data(), dW.data(), db.data(), w.data(), x.data(), W.data(), N, C, OC);
  expect_gradient(x, dx, loss, "inp");
  expect_gradient(W, dW, loss, "weight");
  expect_gradient(b, db, loss, "bias");
}

TEST(GradCheck, Attention) {
  std::mt19937 rng(4);
  const int B = 2, T = 5, C = 6, NH = 2;
  Vec qkv = random_vec(B * T * 3 * C, rng), w = random_vec(B * T * C, rng);
  Vec out(B * T * C), lse(B * NH * T);
  auto loss = [&] {
    ref::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NH);
    return dot(out, w);
  };
  loss();
  Vec dqkv(qkv.size());
  ref::attention_backward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NH);
  expect_gradient(qkv, dqkv, loss, "qkv");
}

TEST(GradCheck, Gelu) {
  std::mt19937 rng(5);
  const int n = 40;
  Vec x = random_vec(n, rng, 2.0), w = random_vec(n, rng), out(n), dx(n);
  auto loss = [&] {
    ref::gelu_forward(out.data(), x.data(), n);
    return dot(out, w);
  };
  ref::gelu_backward(dx.data(), x.data(), w.data(), n);
  expect_gradient(x, dx, loss, "inp");
}

TEST(GradCheck, CrossEntropy) {
  std::mt19937 rng(6);
  const int N = 4, V = 9, Vp = 12;
  std::vector<int> targets = {0, 8, 3, 3};
  Vec logits = random_vec(N * Vp, rng), tl(N), lse(N);
  const double dloss = 0.37;
  auto loss = [&] {
    ref::crossentropy_forward(lse.data(), tl.data(), logits.data(), targets.data(), N, V, Vp, 0);
    double s = 0;
    for (int n = 0; n < N; n++) s += (lse[n] - tl[n]) * dloss;
    return s;
  };
  loss();
  Vec dlogits(N * Vp, 0.0);
  ref::crossentropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), dloss, N, V,
                             Vp, 0);
  expect_gradient(logits, dlogits, loss, "logits");  // padded columns: zero both ways
}

// ---- optimised kernels against the references ----

struct Shape {
  int B, T, C, NH;
};
const Shape kShapes[] = {{1, 1, 8, 1}, {2, 7, 12, 3}, {3, 65, 24, 2}, {2, 130, 64, 4},
                         {1, 200, 48, 1}};

TEST(CpuKernels, EncoderMatchesReference) {
  std::mt19937 rng(10);
  for (auto s : kShapes) {
    const int V = 37, N = s.B * s.T;
    std::vector<int> inp(N);
    for (auto& i : inp) i = rng() % V;
    Vec wte = random_vec(V * s.C, rng), wpe = random_vec(s.T * s.C, rng), dout = random_vec(N * s.C, rng);
    // The whole vocabulary, and a tensor-parallel slice of it (rows [vb, vb + vn)).
    for (auto [vb, vn] : {std::pair{0, V}, {10, 13}}) {
      Vec out(N * s.C), dwte(V * s.C), dwpe(s.T * s.C);
      ref::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), s.B, s.T, s.C, vb, vn);
      ref::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), s.B, s.T, s.C, vb, vn);
      auto fwte = to_float(wte), fwpe = to_float(wpe), fdout = to_float(dout);
      std::vector<float> fout(N * s.C), fdwte(V * s.C), fdwpe(s.T * s.C);
      encoder_forward(fout.data(), inp.data(), fwte.data(), fwpe.data(), s.B, s.T, s.C, vb, vn);
      encoder_backward(fdwte.data(), fdwpe.data(), fdout.data(), inp.data(), s.B, s.T, s.C, vb, vn);
      EXPECT_LT(max_rel_diff(fout, out), 1e-6);
      EXPECT_LT(max_rel_diff(fdwte, dwte), 1e-6);
      EXPECT_LT(max_rel_diff(fdwpe, dwpe), 1e-6);
    }
  }
}

// Summing the slices of every vocabulary-parallel rank gives the whole-vocabulary result.
TEST(CpuKernels, EncoderSlicesSumToTheWhole) {
  std::mt19937 rng(19);
  const int B = 2, T = 5, C = 8, V = 12, tp = 3;
  std::vector<int> inp(B * T);
  for (auto& i : inp) i = rng() % V;
  auto wte = to_float(random_vec(V * C, rng)), wpe = to_float(random_vec(T * C, rng));
  std::vector<float> whole(B * T * C), sum(B * T * C, 0.0f), part(B * T * C);
  encoder_forward(whole.data(), inp.data(), wte.data(), wpe.data(), B, T, C, 0, V);
  for (int r = 0; r < tp; r++) {
    const int vn = V / tp;
    encoder_forward(part.data(), inp.data(), wte.data() + (size_t)r * vn * C,
                    r == 0 ? wpe.data() : nullptr, B, T, C, r * vn, vn);
    for (size_t i = 0; i < sum.size(); i++) sum[i] += part[i];
  }
  for (size_t i = 0; i < sum.size(); i++) ASSERT_FLOAT_EQ(sum[i], whole[i]);
}

TEST(CpuKernels, LayerNormMatchesReference) {
  std::mt19937 rng(11);
  for (auto s : kShapes) {
    const int N = s.B * s.T, C = s.C;
    Vec x = random_vec(N * C, rng, 3.0), g = random_vec(C, rng), b = random_vec(C, rng),
        dout = random_vec(N * C, rng), dx0 = random_vec(N * C, rng);
    Vec out(N * C), mean(N), rstd(N), dx = dx0, dg(C), db(C);
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), N, C);
    ref::layernorm_backward(dx.data(), dg.data(), db.data(), dout.data(), x.data(), g.data(),
                            mean.data(), rstd.data(), N, C);
    auto fx = to_float(x), fg = to_float(g), fb = to_float(b), fdout = to_float(dout),
         fdx = to_float(dx0);
    std::vector<float> fout(N * C), fmean(N), frstd(N), fdg(C), fdb(C);
    layernorm_forward(fout.data(), fmean.data(), frstd.data(), fx.data(), fg.data(), fb.data(), N, C);
    layernorm_backward(fdx.data(), fdg.data(), fdb.data(), fdout.data(), fx.data(), fg.data(),
                       fmean.data(), frstd.data(), N, C);
    EXPECT_LT(max_rel_diff(fout, out), 1e-5);
    EXPECT_LT(max_rel_diff(fdx, dx), 1e-5);  // also checks accumulation into dinp
    EXPECT_LT(max_rel_diff(fdg, dg), 1e-5);
    EXPECT_LT(max_rel_diff(fdb, db), 1e-5);
  }
}

TEST(CpuKernels, MatmulMatchesReference) {
  std::mt19937 rng(12);
  const int dims[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {130, 64, 192}, {64, 257, 31}};
  for (auto& d : dims) {
    const int N = d[0], C = d[1], OC = d[2];
    Vec x = random_vec(N * C, rng), W = random_vec(OC * C, rng), b = random_vec(OC, rng),
        dout = random_vec(N * OC, rng), dW0 = random_vec(OC * C, rng), db0 = random_vec(OC, rng);
    Vec out(N * OC), dx(N * C), dW = dW0, db = db0;
    ref::matmul_forward(out.data(), x.data(), W.data(), b.data(), N, C, OC);
    ref::matmul_backward(dx.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), N, C, OC);
    auto fx = to_float(x), fW = to_float(W), fb = to_float(b), fdout = to_float(dout),
         fdW = to_float(dW0), fdb = to_float(db0);
    std::vector<float> fout(N * OC), fdx(N * C, 123.0f);  // dinp is overwritten
    matmul_forward(fout.data(), fx.data(), fW.data(), fb.data(), N, C, OC);
    matmul_backward(fdx.data(), fdW.data(), fdb.data(), fdout.data(), fx.data(), fW.data(), N, C, OC);
    EXPECT_LT(max_rel_diff(fout, out), 1e-5) << N << "x" << C << "x" << OC;
    EXPECT_LT(max_rel_diff(fdx, dx), 1e-5);
    EXPECT_LT(max_rel_diff(fdW, dW), 1e-5);
    EXPECT_LT(max_rel_diff(fdb, db), 1e-5);
  }
}

// The decoding matmul: near the reference, and each row's result exactly the documented
// order (16 lane sums by fused multiply-adds, a fixed fold, the tail in order, the bias),
// so bit-identical whichever rows share the call, however they are blocked.
float rowwise_order(const float* x, const float* w, int C, float bias) {
  float lanes[16] = {};
  const int C16 = C / 16 * 16;
  for (int k = 0; k < C16; k += 16)
    for (int l = 0; l < 16; l++) lanes[l] = std::fma(x[k + l], w[k + l], lanes[l]);
  for (int half = 8; half > 0; half /= 2)
    for (int l = 0; l < half; l++) lanes[l] += lanes[l + half];
  float sum = lanes[0];
  for (int k = C16; k < C; k++) sum = std::fma(x[k], w[k], sum);
  return sum + bias;
}

TEST(CpuKernels, RowwiseMatmulSumsEachRowInOneOrderWhateverTheRows) {
  std::mt19937 rng(21);
  const int dims[][3] = {{1, 1, 1}, {7, 5, 3}, {9, 33, 17}, {13, 64, 50}, {64, 257, 31}, {5, 768, 130}};
  for (auto& d : dims) {
    const int N = d[0], C = d[1], OC = d[2];
    Vec x = random_vec(N * C, rng), W = random_vec(OC * C, rng), b = random_vec(OC, rng), ref_out(N * OC);
    ref::matmul_forward(ref_out.data(), x.data(), W.data(), b.data(), N, C, OC);
    auto fx = to_float(x), fW = to_float(W), fb = to_float(b);
    std::vector<float> all(N * OC);
    matmul_forward_rowwise(all.data(), fx.data(), fW.data(), fb.data(), N, C, OC);
    EXPECT_LT(max_rel_diff(all, ref_out), 1e-5) << N << "x" << C << "x" << OC;
    for (int n = 0; n < N; n++)
      for (int o = 0; o < OC; o++)
        ASSERT_EQ(all[n * OC + o], rowwise_order(&fx[n * C], &fW[o * C], C, fb[o])) << n << "," << o;
    // Any run of rows on its own (every row alone, and the rows from the middle on).
    for (int first : {0, N / 2, N - 1}) {
      const int rows = first == 0 ? 1 : N - first;
      std::vector<float> part(rows * OC);
      matmul_forward_rowwise(part.data(), &fx[first * C], fW.data(), fb.data(), rows, C, OC);
      EXPECT_EQ(0, std::memcmp(part.data(), &all[first * OC], part.size() * sizeof(float))) << first;
    }
  }
}

// One attention forward and backward: in double by the reference, or by the CPU kernels at
// precision p (dqkv starts as garbage: the kernels must overwrite it).
template <typename T>
struct AttentionRun {
  std::vector<T> out, lse, dqkv;
};
AttentionRun<double> reference_attention(const Vec& qkv, const Vec& dout, const Shape& s) {
  AttentionRun<double> r{Vec(dout.size()), Vec((size_t)s.B * s.NH * s.T), Vec(qkv.size())};
  ref::attention_forward(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, s.NH);
  ref::attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), s.B, s.T,
                          s.C, s.NH, s.NH);
  return r;
}
AttentionRun<float> kernel_attention(const Vec& qkv, const Vec& dout, const Shape& s, Precision p) {
  auto fqkv = to_float(qkv), fdout = to_float(dout);
  AttentionRun<float> r{std::vector<float>(dout.size()), std::vector<float>((size_t)s.B * s.NH * s.T),
                        std::vector<float>(qkv.size(), 5.0f)};
  attention_forward(r.out.data(), r.lse.data(), fqkv.data(), s.B, s.T, s.C, s.NH, s.NH, p);
  attention_backward(r.dqkv.data(), fdout.data(), fqkv.data(), r.out.data(), r.lse.data(), s.B, s.T, s.C,
                     s.NH, s.NH, p);
  return r;
}

TEST(CpuKernels, AttentionMatchesReference) {
  std::mt19937 rng(13);
  for (auto s : kShapes) {
    const int N = s.B * s.T;
    Vec qkv = random_vec(N * 3 * s.C, rng), dout = random_vec(N * s.C, rng);
    const auto want = reference_attention(qkv, dout, s);
    const auto got = kernel_attention(qkv, dout, s, Precision::kFp32);
    EXPECT_LT(max_rel_diff(got.out, want.out), 1e-5) << "T=" << s.T;
    EXPECT_LT(max_rel_diff(got.lse, want.lse), 1e-5);
    EXPECT_LT(max_rel_diff(got.dqkv, want.dqkv), 1e-5);
  }
}

// bf16 attention in double, rounding where the bf16 kernel rounds: q, k, v, the
// probabilities, dout and the scaled score gradients (the fp32 kernel's softmax values
// stand in for the double ones before rounding).
void attention_bf16_reference(Vec& out, Vec& lse, Vec& dqkv, const Vec& qkv, const Vec& dout, int B,
                              int T, int C, int NH) {
  const int hs = C / NH, ld = 3 * C;
  const double scale = 1.0 / std::sqrt((double)hs);
  auto r = [](double x) { return ref::bf16_round((float)x); };
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      auto q = [&](int t, int d) { return r(qkv[((size_t)b * T + t) * ld + h * hs + d]); };
      auto k = [&](int t, int d) { return r(qkv[((size_t)b * T + t) * ld + C + h * hs + d]); };
      auto v = [&](int t, int d) { return r(qkv[((size_t)b * T + t) * ld + 2 * C + h * hs + d]); };
      auto at = [&](int t, int d) { return ((size_t)b * T + t) * C + h * hs + d; };
      std::vector<Vec> P(T, Vec(T, 0.0)), dS(T, Vec(T, 0.0));
      for (int i = 0; i < T; i++) {
        Vec s(i + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= i; j++) {
          for (int d = 0; d < hs; d++) s[j] += q(i, d) * k(j, d);
          s[j] *= scale;
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j <= i; j++) sum += std::exp(s[j] - mx);
        lse[((size_t)b * NH + h) * T + i] = mx + std::log(sum);
        for (int j = 0; j <= i; j++) P[i][j] = r(std::exp(s[j] - mx) / sum);
        for (int d = 0; d < hs; d++) {
          double o = 0;
          for (int j = 0; j <= i; j++) o += P[i][j] * v(j, d);
          out[at(i, d)] = o;
        }
      }
      for (int i = 0; i < T; i++) {
        double D = 0;
        for (int d = 0; d < hs; d++) D += dout[at(i, d)] * out[at(i, d)];
        for (int j = 0; j <= i; j++) {
          double dp = 0;
          for (int d = 0; d < hs; d++) dp += r(dout[at(i, d)]) * v(j, d);
          dS[i][j] = r(scale * P[i][j] * (dp - D));
        }
      }
      for (int t = 0; t < T; t++)
        for (int d = 0; d < hs; d++) {
          double dq = 0, dk = 0, dv = 0;
          for (int j = 0; j < T; j++) {
            dq += dS[t][j] * k(j, d);
            dk += dS[j][t] * q(j, d);
            dv += P[j][t] * r(dout[at(j, d)]);
          }
          const size_t base = ((size_t)b * T + t) * ld + h * hs + d;
          dqkv[base] = dq, dqkv[base + C] = dk, dqkv[base + 2 * C] = dv;
        }
    }
}

// The bf16 attention kernel against a double reference that rounds where it rounds (tight),
// and against exact attention (the price of bf16 operands, bounded loosely).
TEST(Bf16, AttentionMatchesTheReferenceOnRoundedOperands) {
  std::mt19937 rng(43);
  for (auto s : kShapes) {
    const int N = s.B * s.T;
    Vec qkv = random_vec(N * 3 * s.C, rng), dout = random_vec(N * s.C, rng);
    Vec out(N * s.C), lse(s.B * s.NH * s.T), dqkv(qkv.size());
    attention_bf16_reference(out, lse, dqkv, qkv, dout, s.B, s.T, s.C, s.NH);
    const auto exact = reference_attention(qkv, dout, s);
    const Vec& exact_out = exact.out;
    const Vec& exact_lse = exact.lse;
    const Vec& exact_dqkv = exact.dqkv;
    const auto got = kernel_attention(qkv, dout, s, Precision::kBf16);
    const std::vector<float>& fout = got.out;
    const std::vector<float>& flse = got.lse;
    const std::vector<float>& fdqkv = got.dqkv;
    // Against the rounding reference: fp32 accumulation, and the odd probability whose fp32
    // value rounds to the other bf16 neighbour than the double one. One such flip moves an
    // output by one bf16 ulp of P times |v| (up to 2^-7 P |v|). Seen: 8.4e-5 at -O2 and
    // 3.8e-4 in the -O1 sanitizer build (another summation order, one more flip), so the
    // bound on out went from 3e-4 to 1e-3, a flip on any P up to about 0.13.
    EXPECT_LT(max_rel_diff(fout, out), 1e-3) << "T=" << s.T;
    EXPECT_LT(max_rel_diff(flse, lse), 1e-5) << "T=" << s.T;
    EXPECT_LT(max_rel_diff(fdqkv, dqkv), 3e-4) << "T=" << s.T;
    // Against exact attention: bf16 keeps 8 significant bits (seen: out 5.1e-3, lse 1.7e-3,
    // dqkv 4.9e-3).
    EXPECT_LT(max_rel_diff(fout, exact_out), 2e-2) << "T=" << s.T;
    EXPECT_LT(max_rel_diff(flse, exact_lse), 1e-2) << "T=" << s.T;
    EXPECT_LT(max_rel_diff(fdqkv, exact_dqkv), 2e-2) << "T=" << s.T;
  }
}

// Past 1024 rows the bf16 kernel runs in tiles of 256 query rows against the keys they
// see (issue 45: memory that does not grow as T^2): the same values as the rounding
// reference, and a thread's scratch growing as 256 x T, not T x T.
TEST(Bf16, LongSequencesRunInTilesOfQueryRows) {
  std::mt19937 rng(47);
  auto workspace = [] { return MemoryTracker::instance().stats().current[(int)MemCategory::kWorkspace]; };
  const int64_t before = workspace();  // other kernels' per-thread caches, and the last test's scratch
  const Shape s{1, 1100, 32, 2};       // five tiles, the last of 76 rows
  const int N = s.B * s.T;
  Vec qkv = random_vec(N * 3 * s.C, rng), dout = random_vec(N * s.C, rng);
  Vec out(N * s.C), lse(s.B * s.NH * s.T), dqkv(qkv.size());
  attention_bf16_reference(out, lse, dqkv, qkv, dout, s.B, s.T, s.C, s.NH);
  const auto got = kernel_attention(qkv, dout, s, Precision::kBf16);
  EXPECT_LT(max_rel_diff(got.out, out), 1e-3);
  EXPECT_LT(max_rel_diff(got.lse, lse), 1e-5);
  // dK and dV sum over the tiles in another order than one product's: 5e-4 here against the
  // one-tile test's 3e-4 (seen: 3.06e-4 in the -O1 sanitizer build's widened path).
  EXPECT_LT(max_rel_diff(got.dqkv, dqkv), 5e-4);
  // The scratch: a T x T one would be 12 T^2 bytes a thread (fp32 scores and dP, their bf16
  // roundings), and quadruple when T doubles; tiles keep it under that and about double.
  const int64_t at_1100 = workspace() - before;
  EXPECT_LT(at_1100, omp_get_max_threads() * 12 * (int64_t)s.T * s.T);
  const Shape twice{1, 2 * s.T, s.C, s.NH};
  (void)kernel_attention(random_vec(2 * N * 3 * s.C, rng), random_vec(2 * N * s.C, rng), twice, Precision::kBf16);
  const int64_t at_2200 = workspace() - before;
  EXPECT_GT(at_2200, at_1100);
  EXPECT_LT(at_2200, 3 * at_1100) << "the scratch grows as T, not T^2";
}

// The KV-cache kernel reproduces rows p..p+n-1 of full causal attention (reference and
// optimised), for prefill (p = 0) and decode-like shapes.
TEST(CpuKernels, CachedAttentionMatchesFullAttention) {
  std::mt19937 rng(17);
  const int T = 37, C = 24, NH = 3;
  Vec qkv = random_vec(T * 3 * C, rng);
  Vec full(T * C), lse(NH * T);
  ref::attention_forward(full.data(), lse.data(), qkv.data(), 1, T, C, NH, NH);
  Vec k_cache(T * C), v_cache(T * C);
  for (int t = 0; t < T; t++)
    for (int c = 0; c < C; c++) {
      k_cache[t * C + c] = qkv[t * 3 * C + C + c];
      v_cache[t * C + c] = qkv[t * 3 * C + 2 * C + c];
    }
  auto fqkv = to_float(qkv), fk = to_float(k_cache), fv = to_float(v_cache);
  for (auto [p, n] : {std::pair{0, T}, {0, 1}, {10, 1}, {36, 1}, {5, 17}}) {
    Vec out(n * C);
    ref::attention_cached_forward(out.data(), qkv.data() + (size_t)p * 3 * C, 3 * C, k_cache.data(),
                                  v_cache.data(), p, n, C, NH, NH);
    Vec expect(full.begin() + p * C, full.begin() + (p + n) * C);
    for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], expect[i], 1e-12);
    std::vector<float> fout(n * C);
    attention_cached_forward(fout.data(), fqkv.data() + (size_t)p * 3 * C, 3 * C, fk.data(),
                             fv.data(), p, n, C, NH, NH);
    EXPECT_LT(max_rel_diff(fout, expect), 1e-5) << "p=" << p << " n=" << n;
  }
}

TEST(CpuKernels, GeluMatchesReference) {
  std::mt19937 rng(14);
  const size_t n = 1001;
  Vec x = random_vec(n, rng, 3.0), dout = random_vec(n, rng), out(n), dx(n);
  x[0] = 20, x[1] = -20, x[2] = 0;  // saturated tails and the origin
  ref::gelu_forward(out.data(), x.data(), n);
  ref::gelu_backward(dx.data(), x.data(), dout.data(), n);
  auto fx = to_float(x), fdout = to_float(dout);
  std::vector<float> fout(n), fdx(n);
  gelu_forward(fout.data(), fx.data(), n);
  gelu_backward(fdx.data(), fx.data(), fdout.data(), n);
  EXPECT_LT(max_rel_diff(fout, out), 1e-6);
  EXPECT_LT(max_rel_diff(fdx, dx), 1e-6);
}

TEST(CpuKernels, CrossEntropyMatchesReferenceAndIgnoresPadding) {
  std::mt19937 rng(15);
  const int N = 37, V = 1001, Vp = 1024;
  Vec logits = random_vec(N * Vp, rng, 4.0);
  std::vector<int> targets(N);
  for (auto& t : targets) t = rng() % V;
  Vec tl(N), lse(N), dlogits(N * Vp, 0.0);
  ref::crossentropy_forward(lse.data(), tl.data(), logits.data(), targets.data(), N, V, Vp, 0);
  ref::crossentropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0.5, N, V, Vp, 0);
  auto flogits = to_float(logits);
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) flogits[(size_t)n * Vp + v] = 1e30f;  // padding must not matter
  std::vector<float> ftl(N), flse(N);
  crossentropy_forward(flse.data(), ftl.data(), flogits.data(), targets.data(), N, V, Vp, 0);
  EXPECT_LT(max_rel_diff(flse, lse), 1e-5);
  EXPECT_LT(max_rel_diff(ftl, tl), 1e-6);
  crossentropy_backward(flogits.data(), flogits.data(), flse.data(), targets.data(), 0.5f, N, V, Vp, 0);
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) ASSERT_EQ(flogits[(size_t)n * Vp + v], 1e30f) << "padding written";
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) dlogits[(size_t)n * Vp + v] = 1e30;
  EXPECT_LT(max_rel_diff(flogits, dlogits), 1e-5);
}

// Vocabulary-parallel pieces combine into the whole-vocabulary loss: lse by log-sum-exp
// over ranks, the target logit by sum (exactly one rank holds the target).
TEST(CpuKernels, CrossEntropySlicesCombineToTheWhole) {
  std::mt19937 rng(18);
  const int N = 9, V = 30, tp = 4, vn_full = 8;  // slices of 8 columns; the last has 6 real
  Vec logits = random_vec(N * V, rng, 3.0);
  std::vector<int> targets(N);
  for (auto& t : targets) t = rng() % V;
  Vec lse(N), tl(N);
  ref::crossentropy_forward(lse.data(), tl.data(), logits.data(), targets.data(), N, V, V, 0);
  Vec max_lse(N, -INFINITY), sum_tl(N, 0.0);
  std::vector<Vec> lses;
  for (int r = 0; r < tp; r++) {
    const int vb = r * vn_full, vn = std::min(vn_full, V - vb);
    Vec slice(N * vn_full, 0.0), l(N), t(N);
    for (int n = 0; n < N; n++)
      for (int v = 0; v < vn; v++) slice[n * vn_full + v] = logits[n * V + vb + v];
    auto fs = to_float(slice);
    std::vector<float> fl(N), ft(N);
    crossentropy_forward(fl.data(), ft.data(), fs.data(), targets.data(), N, vn, vn_full, vb);
    lses.emplace_back(fl.begin(), fl.end());
    for (int n = 0; n < N; n++) max_lse[n] = std::max(max_lse[n], (double)fl[n]), sum_tl[n] += ft[n];
  }
  for (int n = 0; n < N; n++) {
    double s = 0;
    for (const auto& l : lses) s += std::exp(l[n] - max_lse[n]);
    EXPECT_NEAR(max_lse[n] + std::log(s), lse[n], 1e-5);
    EXPECT_NEAR(sum_tl[n], tl[n], 1e-6);
  }
}

// Dropout keeps 1-p of the elements, scaled; a row's mask depends only on its global row
// index, so applying it to rows [0, n) at once or in shards with row offsets agrees, and
// the backward (the same call on the gradient) uses the same mask.
TEST(CpuKernels, DropoutIsLayoutInvariantAndUnbiased) {
  const int rows = 64, C = 97;
  const float p = 0.25f;
  const uint64_t key = 12345;
  std::vector<float> whole(rows * C, 1.0f), sharded(rows * C, 1.0f);
  dropout_forward(whole.data(), rows, C, p, key, 1000);
  for (int r0 = 0; r0 < rows; r0 += 16)
    dropout_forward(sharded.data() + (size_t)r0 * C, 16, C, p, key, 1000 + r0);
  ASSERT_EQ(whole, sharded);
  int kept = 0;
  for (float x : whole) {
    ASSERT_TRUE(x == 0.0f || x == 1.0f / (1.0f - p));
    kept += x != 0.0f;
  }
  const double frac = (double)kept / whole.size();
  EXPECT_NEAR(frac, 1.0 - p, 0.02);  // 6208 draws: sigma ~ 0.0055
  std::vector<float> other(rows * C, 1.0f);
  dropout_forward(other.data(), rows, C, p, key + 1, 1000);
  EXPECT_NE(other, whole) << "another key (step, site, seed) draws another mask";
}

TEST(CpuKernels, GemmMatchesReferenceForAllTranspositions) {
  std::mt19937 rng(16);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int M = 13, N = 9, K = 21, lda = ta ? M + 2 : K + 3, ldb = tb ? K + 1 : N + 4, ldc = N + 5;
      Vec A = random_vec((size_t)(ta ? K : M) * lda, rng), B = random_vec((size_t)(tb ? N : K) * ldb, rng),
          C = random_vec((size_t)M * ldc, rng);
      auto fA = to_float(A), fB = to_float(B), fC = to_float(C);
      ref::gemm(ta, tb, M, N, K, 0.5, A.data(), lda, B.data(), ldb, 2.0, C.data(), ldc);
      gemm(ta, tb, M, N, K, 0.5f, fA.data(), lda, fB.data(), ldb, 2.0f, fC.data(), ldc);
      EXPECT_LT(max_rel_diff(fC, C), 1e-5) << ta << tb;
    }
}

// ---- mixed precision ----

uint16_t bits_of_bf16(float f) {
  uint16_t out;
  to_bf16(&f, &out, 1);
  return out;
}

float float_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecialValues) {
  EXPECT_EQ(bits_of_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bits_of_bf16(float_of_bits(0x3F808000)), 0x3F80);  // tie, down to even
  EXPECT_EQ(bits_of_bf16(float_of_bits(0x3F818000)), 0x3F82);  // tie, up to even
  EXPECT_EQ(bits_of_bf16(float_of_bits(0x3F808001)), 0x3F81);  // above the tie
  EXPECT_EQ(bits_of_bf16(float_of_bits(0xBF80FFFF)), 0xBF81);
  EXPECT_EQ(bits_of_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(bits_of_bf16(-INFINITY), 0xFF80);
  const uint16_t nan = bits_of_bf16(NAN);
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0) << "NaN must stay NaN, not become infinity";
  EXPECT_EQ(bits_of_bf16(float_of_bits(0x7F7FFFFF)), 0x7F80) << "the largest float rounds up to inf";
  // The vectorised path (long arrays) equals the scalar one (tail elements) everywhere,
  // ties included, and equals the double-precision reference rounding.
  std::mt19937 rng(3);
  std::vector<float> x(40000);
  for (auto& v : x) {
    const uint32_t u = (uint32_t)(rng() & 0x3FFFFFFFu) | 0x30000000u;  // finite, normal
    v = float_of_bits((rng() & 1) ? u : (u & 0xFFFF0000u) | 0x8000u);   // half are ties
  }
  std::vector<uint16_t> vec(x.size());
  to_bf16(x.data(), vec.data(), x.size());
  std::vector<float> back(x.size());
  from_bf16(vec.data(), back.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    ASSERT_EQ(vec[i], bits_of_bf16(x[i])) << i;
    ASSERT_EQ((double)back[i], ref::bf16_round(x[i])) << i;
  }
}

TEST(Bf16, GemmMatchesTheReferenceOnRoundedOperands) {
  std::mt19937 rng(17);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        const int M = 37, N = 29, K = 70, lda = ta ? M + 2 : K + 3, ldb = tb ? K + 1 : N + 4,
                  ldc = N + 5;
        Vec A = random_vec((size_t)(ta ? K : M) * lda, rng), B = random_vec((size_t)(tb ? N : K) * ldb, rng),
            C = random_vec((size_t)M * ldc, rng);
        auto fA = to_float(A), fB = to_float(B), fC = to_float(C);
        for (auto& a : A) a = ref::bf16_round((float)a);
        for (auto& b : B) b = ref::bf16_round((float)b);
        ref::gemm(ta, tb, M, N, K, 1.0, A.data(), lda, B.data(), ldb, (double)beta, C.data(), ldc);
        gemm(Precision::kBf16, ta, tb, M, N, K, 1.0f, fA.data(), lda, fB.data(), ldb, beta, fC.data(), ldc);
        // Products of bf16 values are exact in fp32; only the fp32 accumulation rounds.
        EXPECT_LT(max_rel_diff(fC, C), 1e-5) << ta << tb << beta;
      }
}

TEST(Bf16, MatmulMatchesTheReferenceOnRoundedOperands) {
  std::mt19937 rng(18);
  const int N = 45, C = 67, OC = 33;
  Vec inp = random_vec((size_t)N * C, rng), w = random_vec((size_t)OC * C, rng),
      bias = random_vec(OC, rng), dout = random_vec((size_t)N * OC, rng);
  auto round_all = [](Vec v) {
    for (auto& x : v) x = ref::bf16_round((float)x);
    return v;
  };
  Vec out((size_t)N * OC), dinp((size_t)N * C), dw((size_t)OC * C, 0.0), db(OC, 0.0);
  const Vec rin = round_all(inp), rw = round_all(w), rdout = round_all(dout);
  ref::matmul_forward(out.data(), rin.data(), rw.data(), bias.data(), N, C, OC);
  ref::matmul_backward(dinp.data(), dw.data(), db.data(), rdout.data(), rin.data(), rw.data(), N, C, OC);
  auto f_in = to_float(inp), f_w = to_float(w), f_b = to_float(bias), f_dout = to_float(dout);
  std::vector<float> f_out((size_t)N * OC), f_dinp((size_t)N * C), f_dw((size_t)OC * C, 0.f), f_db(OC, 0.f);
  matmul_forward(f_out.data(), f_in.data(), f_w.data(), f_b.data(), N, C, OC, Precision::kBf16);
  matmul_backward(f_dinp.data(), f_dw.data(), f_db.data(), f_dout.data(), f_in.data(), f_w.data(), N, C,
                  OC, Precision::kBf16);
  EXPECT_LT(max_rel_diff(f_out, out), 1e-5);
  EXPECT_LT(max_rel_diff(f_dinp, dinp), 1e-5);
  EXPECT_LT(max_rel_diff(f_dw, dw), 1e-5);
  // The bias gradient sums the fp32 dout (not rounded).
  Vec db_exact(OC, 0.0);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) db_exact[o] += dout[(size_t)n * OC + o];
  EXPECT_LT(max_rel_diff(f_db, db_exact), 1e-5);
}

// Operands handed over already in bf16 (16-bit weights, a tensor rounded once for two
// GEMMs, the head's in-place bf16 gradient) give exactly what rounding inside the GEMM
// gives, with their own leading dimensions.
TEST(Bf16, PreRoundedOperandsEqualRoundingInTheGemm) {
  std::mt19937 rng(23);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int M = 33, N = 41, K = 52, lda = ta ? M + 3 : K + 1, ldb = tb ? K + 2 : N + 5, ldc = N;
      auto A = to_float(random_vec((size_t)(ta ? K : M) * lda, rng));
      auto B = to_float(random_vec((size_t)(tb ? N : K) * ldb, rng));
      // A's bf16 copy is stored with a wider stride than its fp32 original.
      const int lda16 = lda + 7;
      std::vector<uint16_t> A16((size_t)(ta ? K : M) * lda16), B16(B.size());
      for (int r = 0; r < (ta ? K : M); r++) to_bf16(&A[(size_t)r * lda], &A16[(size_t)r * lda16], lda);
      to_bf16(B.data(), B16.data(), B.size());
      std::vector<float> want((size_t)M * ldc), got_a(want.size()), got_b(want.size()), got_ab(want.size());
      gemm(Precision::kBf16, ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, want.data(), ldc);
      gemm(Precision::kBf16, ta, tb, M, N, K, 1.0f, GemmInput(A16.data()), lda16, B.data(), ldb, 0.0f,
           got_a.data(), ldc);
      gemm(Precision::kBf16, ta, tb, M, N, K, 1.0f, A.data(), lda, GemmInput(B16.data()), ldb, 0.0f,
           got_b.data(), ldc);
      gemm(Precision::kBf16, ta, tb, M, N, K, 1.0f, GemmInput(A16.data()), lda16, GemmInput(B16.data()),
           ldb, 0.0f, got_ab.data(), ldc);
      EXPECT_EQ(got_a, want) << ta << tb;
      EXPECT_EQ(got_b, want) << ta << tb;
      EXPECT_EQ(got_ab, want) << ta << tb;
    }
  // A bf16 operand at another precision is a programming error, not a silent widening.
  std::vector<uint16_t> w(4);
  std::vector<float> x(4), out(4);
  EXPECT_DEATH(gemm(Precision::kFp32, false, true, 2, 2, 2, 1.0f, x.data(), 2, GemmInput(w.data()), 2,
                    0.0f, out.data(), 2),
               "bf16 GEMM operand");
}

// The bf16 head gradient written over the logits equals the fp32 gradient rounded, for
// targets in the vectorised chunks and in the tail, a vocabulary slice and padded rows.
TEST(Bf16, InPlaceCrossEntropyGradientEqualsTheRoundedFp32One) {
  std::mt19937 rng(29);
  for (auto [V, vb, vn, ld] : {std::tuple{5000, 0, 5000, 5008}, {4099, 0, 4099, 4100}, {3000, 1000, 999, 1024},
                               {17, 0, 17, 32}}) {
    const int N = 13;
    auto logits = to_float(random_vec((size_t)N * ld, rng, 3.0));
    std::vector<int> targets(N);
    for (int n = 0; n < N; n++) targets[n] = n < 3 ? vb + vn - 1 - n : vb + (int)(rng() % vn);
    targets[3] = vb + 2048 % vn;  // the first column of the second chunk
    targets[4] = vb > 0 ? 0 : vb + vn + 1;  // another rank's slice: no column of this one
    std::vector<float> lse(N), tl(N);
    crossentropy_forward(lse.data(), tl.data(), logits.data(), targets.data(), N, vn, ld, vb);
    std::vector<float> want = logits;
    crossentropy_backward(want.data(), want.data(), lse.data(), targets.data(), 0.25f, N, vn, ld, vb);
    std::vector<float> inplace = logits;
    const uint16_t* got = crossentropy_backward_bf16_inplace(inplace.data(), lse.data(), targets.data(),
                                                             0.25f, N, vn, ld, vb);
    ASSERT_EQ((const void*)got, (const void*)inplace.data());
    for (int n = 0; n < N; n++) {
      std::vector<uint16_t> row(vn);
      to_bf16(&want[(size_t)n * ld], row.data(), vn);
      for (int v = 0; v < vn; v++)
        ASSERT_EQ(got[(size_t)n * 2 * ld + v], row[v]) << "V " << V << " row " << n << " column " << v;
    }
  }
}

// A linear weight's gradient added by the GEMM into bf16 storage equals the fp32 gradient
// added by add_to_half: the sum in fp32, rounded once.
TEST(Bf16, WeightGradientAccumulatesIntoBf16LikeAddToHalf) {
  std::mt19937 rng(47);
  const int N = 64, C = 48, OC = 40;
  auto inp = to_float(random_vec((size_t)N * C, rng)), w = to_float(random_vec((size_t)OC * C, rng));
  auto dout = to_float(random_vec((size_t)N * OC, rng)), g0 = to_float(random_vec((size_t)OC * C, rng));
  std::vector<uint16_t> want(g0.size()), got(g0.size());
  to_bf16(g0.data(), want.data(), g0.size());
  got = want;
  std::vector<float> dw((size_t)OC * C, 0.0f), dinp((size_t)N * C), db(OC, 0.0f), db2(OC, 0.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC, Precision::kBf16);
  add_to_half(Precision::kBf16, want.data(), dw.data(), dw.size());
  std::vector<float> dinp2(dinp.size());
  matmul_backward(dinp2.data(), GradOutput(got.data()), db2.data(), dout.data(), inp.data(), w.data(), N, C,
                  OC, Precision::kBf16);
  EXPECT_EQ(got, want);
  EXPECT_EQ(dinp2, dinp);
  EXPECT_EQ(db2, db);
  EXPECT_DEATH(matmul_backward(dinp2.data(), GradOutput(got.data()), db2.data(), dout.data(), inp.data(),
                               w.data(), N, C, OC, Precision::kFp32),
               "bf16 weight gradient");
}

TEST(Bf16, GeluWritesItsOutputRounded) {
  std::mt19937 rng(37);
  for (size_t n : {5ul, 1024ul, 3001ul, 70000ul}) {
    auto x = to_float(random_vec(n, rng, 3.0));
    std::vector<float> y(n);
    gelu_forward(y.data(), x.data(), n);
    std::vector<uint16_t> want(n), got(n);
    to_bf16(y.data(), want.data(), n);
    gelu_forward(got.data(), x.data(), n);
    EXPECT_EQ(got, want) << n;
  }
}

// A bias given to the GEMM equals seeding C with it, at every precision, with beta 0 and 1.
TEST(Bf16, GemmBiasEqualsSeedingTheOutput) {
  std::mt19937 rng(41);
  const int M = 19, N = 35, K = 24;
  auto A = to_float(random_vec((size_t)M * K, rng)), B = to_float(random_vec((size_t)N * K, rng));
  auto bias = to_float(random_vec(N, rng)), C0 = to_float(random_vec((size_t)M * N, rng));
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> want = C0, got = C0;
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) want[(size_t)i * N + j] = beta * want[(size_t)i * N + j] + bias[j];
      gemm(p, false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 1.0f, want.data(), N);
      gemm(p, false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, beta, got.data(), N, bias.data());
      // oneDNN adds the bias in its epilogue rather than first: the sums may differ in the
      // last bit.
      EXPECT_LT(max_rel_diff(got, Vec(want.begin(), want.end())), 1e-6) << precision_name(p) << beta;
    }
}

TEST(Bf16, EncoderReadsBf16EmbeddingsExactly) {
  std::mt19937 rng(31);
  const int B = 2, T = 9, C = 40, V = 21;
  auto wte = to_float(random_vec((size_t)V * C, rng)), wpe = to_float(random_vec((size_t)T * C, rng));
  std::vector<uint16_t> wte16(wte.size());
  to_bf16(wte.data(), wte16.data(), wte.size());
  std::vector<float> widened(wte.size());
  from_bf16(wte16.data(), widened.data(), wte.size());
  std::vector<int> inp(B * T);
  for (auto& i : inp) i = rng() % V;
  for (auto [vb, vn] : {std::pair{0, V}, {5, 8}}) {
    std::vector<float> want((size_t)B * T * C), got(want.size());
    encoder_forward(want.data(), inp.data(), widened.data(), wpe.data(), B, T, C, vb, vn);
    encoder_forward(got.data(), inp.data(), wte16.data(), wpe.data(), B, T, C, vb, vn);
    EXPECT_EQ(got, want);
  }
}

TEST(Fp16, RoundingMatchesTheReferenceAcrossTheRange) {
  // Normal values, subnormals (below 2^-14), values near and beyond the largest half
  // (65504; 65520 and up become inf), ties: the vector and the scalar paths and the
  // double-precision reference agree on every one.
  std::mt19937 rng(5);
  std::vector<float> x;
  for (int i = 0; i < 30000; i++) {
    const int e = (int)(rng() % 60) - 34;  // 2^-34 .. 2^25
    float v = std::ldexp(1.0f + (float)(rng() % 4096) / 4096.0f, e);
    x.push_back((rng() & 1) ? v : -v);
  }
  for (float v : {65504.0f, 65519.0f, 65520.0f, 1e9f, 5.9604645e-8f, 2.9802322e-8f, 1.0009766f})
    x.push_back(v), x.push_back(-v);
  std::vector<float> out(x.size());
  round_to_fp16(x.data(), out.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    ASSERT_EQ((double)out[i], ref::fp16_round(x[i])) << "x = " << x[i];
    float one;
    round_to_fp16(&x[i], &one, 1);  // the scalar path
    ASSERT_EQ(one, out[i]) << "x = " << x[i];
  }
  float big = 70000.0f, r;
  round_to_fp16(&big, &r, 1);
  EXPECT_TRUE(std::isinf(r)) << "beyond the half range an operand becomes inf (loss scaling's overflow)";
}

TEST(Fp16, GemmMatchesTheReferenceOnRoundedOperands) {
  std::mt19937 rng(19);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int M = 21, N = 17, K = 40, lda = ta ? M + 1 : K + 2, ldb = tb ? K + 3 : N + 1, ldc = N + 2;
      Vec A = random_vec((size_t)(ta ? K : M) * lda, rng), B = random_vec((size_t)(tb ? N : K) * ldb, rng),
          C = random_vec((size_t)M * ldc, rng);
      auto fA = to_float(A), fB = to_float(B), fC = to_float(C);
      for (auto& a : A) a = ref::fp16_round((float)a);
      for (auto& b : B) b = ref::fp16_round((float)b);
      ref::gemm(ta, tb, M, N, K, 0.5, A.data(), lda, B.data(), ldb, 1.0, C.data(), ldc);
      gemm(Precision::kFp16, ta, tb, M, N, K, 0.5f, fA.data(), lda, fB.data(), ldb, 1.0f, fC.data(), ldc);
      EXPECT_LT(max_rel_diff(fC, C), 1e-5) << ta << tb;
    }
}

}  // namespace
}  // namespace meshtrain::kernels::test_kernels

// ---- the machine's kernels: what runs where there are no bf16 units or no F16C ----

namespace meshtrain::kernels::test_kernels {
namespace {

// bf16 GEMMs go to oneDNN exactly when its effective ISA has bf16 instructions (AVX512_BF16,
// or AMX, whose mask includes them); ONEDNN_MAX_CPU_ISA=AVX2 on an AMX machine must
// therefore select the widened path, as an AVX2-only CPU does.
TEST(Bf16, BackendFollowsOneDnnIsa) {
  const std::string isa = onednn_isa_name();
  const bool bf16_isa = isa == "avx512_core_bf16" || isa == "avx512_core_amx";
  EXPECT_EQ(bf16_backend() == Bf16Backend::kOneDnn, bf16_isa) << isa;
  EXPECT_EQ(peak_precision(Precision::kBf16), bf16_isa ? Precision::kBf16 : Precision::kFp32);
  EXPECT_EQ(peak_precision(Precision::kFp16), Precision::kFp32);
  EXPECT_NE(std::string(gemm_kernel_name(Precision::kBf16)).find(bf16_isa ? "oneDNN bf16" : "widened"),
            std::string::npos)
      << gemm_kernel_name(Precision::kBf16);
}

// Runs every bf16 GEMM entry (both transposes, beta 0 and 1, a bias, accumulation into bf16
// words) and the bf16 attention on the current backend; returns the outputs concatenated.
std::vector<float> bf16_kernel_outputs() {
  std::mt19937 rng(53);
  std::vector<float> all;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        const int M = 23, N = 31, K = 45, lda = ta ? M + 1 : K + 2, ldb = tb ? K + 3 : N + 1, ldc = N + 2;
        auto A = to_float(random_vec((size_t)(ta ? K : M) * lda, rng)), B = to_float(random_vec((size_t)(tb ? N : K) * ldb, rng));
        auto C = to_float(random_vec((size_t)M * ldc, rng)), bias = to_float(random_vec(N, rng));
        gemm(Precision::kBf16, ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc,
             beta == 1.0f ? bias.data() : nullptr);
        all.insert(all.end(), C.begin(), C.end());
        std::vector<uint16_t> acc((size_t)M * ldc);
        to_bf16(C.data(), acc.data(), acc.size());
        gemm_accumulate_bf16(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, acc.data(), ldc);
        std::vector<float> widened(acc.size());
        from_bf16(acc.data(), widened.data(), acc.size());
        all.insert(all.end(), widened.begin(), widened.end());
      }
  const int Bt = 2, T = 37, Ch = 48, NH = 4;
  auto qkv = to_float(random_vec((size_t)Bt * T * 3 * Ch, rng)), dout = to_float(random_vec((size_t)Bt * T * Ch, rng));
  std::vector<float> out((size_t)Bt * T * Ch), lse((size_t)Bt * NH * T), dqkv(qkv.size());
  attention_forward(out.data(), lse.data(), qkv.data(), Bt, T, Ch, NH, NH, Precision::kBf16);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), Bt, T, Ch, NH, NH, Precision::kBf16);
  for (const auto* v : {&out, &lse, &dqkv}) all.insert(all.end(), v->begin(), v->end());
  return all;
}

// Where the CPU has bf16 units, the widened fp32 path (what an AVX2 machine runs) gives the
// same values: the products are exact in fp32 on both, only the order of the fp32 sums
// differs (bf16-rounded results may then differ by one bf16 ulp, 2^-8 relative).
TEST(Bf16, WidenedPathEqualsTheBf16Units) {
  if (bf16_backend() != Bf16Backend::kOneDnn)
    GTEST_SKIP() << "no bf16 units here (oneDNN ISA " << onednn_isa_name()
                 << "): the widened path is what every Bf16 test ran";
  const std::vector<float> native = bf16_kernel_outputs();
  force_bf16_backend(Bf16Backend::kWidenedFp32);
  const std::vector<float> widened = bf16_kernel_outputs();
  force_bf16_backend(Bf16Backend::kOneDnn);
  ASSERT_EQ(native.size(), widened.size());
  double worst = 0;
  for (size_t i = 0; i < native.size(); i++)
    worst = std::max(worst, std::abs((double)native[i] - widened[i]) / std::max(1.0, std::abs((double)native[i])));
  EXPECT_LT(worst, 1.0 / 128);
}

}  // namespace
}  // namespace meshtrain::kernels::test_kernels

namespace meshtrain::kernels::test_kernels {
namespace {

#if defined(__F16C__)
uint16_t hardware_fp16_bits(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
float hardware_fp16_value(uint16_t h) { return _cvtsh_ss(h); }
#endif

// The portable half conversions, which a build without F16C uses, give F16C's bits: every
// one of the 65536 halves widened, and floats of every exponent narrowed, ties, the
// overflow boundary and NaNs included. Without F16C in the build, the double-precision
// reference judges the values instead.
TEST(Fp16, PortableConversionsEqualF16c) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float v = fp16_value_portable((uint16_t)h);
#if defined(__F16C__)
    ASSERT_EQ(std::bit_cast<uint32_t>(v), std::bit_cast<uint32_t>(hardware_fp16_value((uint16_t)h))) << h;
#endif
    if (!std::isnan(v)) {
      ASSERT_EQ(fp16_bits_portable(v), (uint16_t)h) << "round trip of " << h;
    }
  }
  std::mt19937 rng(61);
  std::vector<float> x;
  for (int i = 0; i < 400000; i++) x.push_back(std::bit_cast<float>((uint32_t)rng()));
  for (uint32_t h = 0; h < 65535; h++) {  // every half-way point between neighbouring halves
    const float lo = fp16_value_portable((uint16_t)h), hi = fp16_value_portable((uint16_t)(h + 1));
    if (std::isfinite(lo) && std::isfinite(hi)) x.push_back((float)(((double)lo + hi) / 2));
  }
  for (float v : {65504.0f, 65519.996f, 65520.0f, 1e30f, INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-30f})
    x.push_back(v);
  for (float v : x) {
#if defined(__F16C__)
    ASSERT_EQ(fp16_bits_portable(v), hardware_fp16_bits(v)) << "x = " << v << " bits " << std::bit_cast<uint32_t>(v);
#else
    if (!std::isnan(v)) ASSERT_EQ((double)fp16_value_portable(fp16_bits_portable(v)), ref::fp16_round(v)) << v;
#endif
  }
}

}  // namespace
}  // namespace meshtrain::kernels::test_kernels
