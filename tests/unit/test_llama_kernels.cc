// The Llama-family kernels (RMSNorm, RoPE, SwiGLU, grouped-query attention): (1) the naive
// references against central finite differences in double; (2) the CPU kernels against the
// references; (3) grouped-query attention against multi-head attention on duplicated
// key/value heads, which is what it must equal.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"

namespace meshtrain::kernels::test_llama_kernels {
namespace {

using namespace test_util;

// ---- references against finite differences ----

TEST(GradCheck, RmsNorm) {
  std::mt19937 rng(21);
  const int N = 3, C = 7;
  Vec x = random_vec(N * C, rng), g = random_vec(C, rng), w = random_vec(N * C, rng);
  Vec out(N * C), rstd(N);
  auto loss = [&] {
    ref::rmsnorm_forward(out.data(), rstd.data(), x.data(), g.data(), N, C, 1e-5);
    return dot(out, w);
  };
  loss();
  Vec dx(N * C, 0.0), dg(C, 0.0);
  ref::rmsnorm_backward(dx.data(), dg.data(), w.data(), x.data(), g.data(), rstd.data(), N, C);
  expect_gradient(x, dx, loss, "inp");
  expect_gradient(g, dg, loss, "weight");
}

TEST(GradCheck, Rope) {
  std::mt19937 rng(22);
  const int B = 2, T = 5, heads = 3, hs = 8, ld = heads * hs + 5;  // a row stride wider than the heads
  std::vector<double> inv_freq(hs / 2);
  rope_inverse_frequencies(inv_freq.data(), hs, 10000.0, {});
  Vec x = random_vec(B * T * ld, rng), w = random_vec(B * T * ld, rng);
  auto loss = [&] {
    Vec y = x;
    ref::rope_rotate(y.data(), B * T, T, ld, heads, hs, inv_freq.data(), 3, false);
    return dot(y, w);
  };
  // The gradient of a rotation is the inverse rotation of the output gradient; columns past
  // the heads pass through.
  Vec dx = w;
  ref::rope_rotate(dx.data(), B * T, T, ld, heads, hs, inv_freq.data(), 3, true);
  expect_gradient(x, dx, loss, "x");
}

TEST(GradCheck, SwiGlu) {
  std::mt19937 rng(23);
  const int N = 4, F = 6;
  Vec x = random_vec(N * 2 * F, rng, 2.0), w = random_vec(N * F, rng), out(N * F), dx(N * 2 * F);
  auto loss = [&] {
    ref::swiglu_forward(out.data(), x.data(), N, F);
    return dot(out, w);
  };
  ref::swiglu_backward(dx.data(), x.data(), w.data(), N, F);
  expect_gradient(x, dx, loss, "inp");
}

TEST(GradCheck, GroupedQueryAttention) {
  std::mt19937 rng(24);
  for (auto [NH, NKV] : {std::pair{4, 2}, {3, 1}}) {
    const int B = 2, T = 5, hs = 3, C = NH * hs, ld = C + 2 * NKV * hs;
    Vec qkv = random_vec(B * T * ld, rng), w = random_vec(B * T * C, rng);
    Vec out(B * T * C), lse(B * NH * T);
    auto loss = [&] {
      ref::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV);
      return dot(out, w);
    };
    loss();
    Vec dqkv(qkv.size());
    ref::attention_backward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV);
    expect_gradient(qkv, dqkv, loss, NKV == 1 ? "qkv (MQA)" : "qkv (GQA)");
  }
}

// ---- CPU kernels against the references ----

TEST(CpuKernels, RmsNormMatchesReference) {
  std::mt19937 rng(31);
  for (auto [N, C] : {std::pair{1, 1}, {5, 7}, {37, 64}, {130, 300}}) {
    Vec x = random_vec(N * C, rng), g = random_vec(C, rng), dout = random_vec(N * C, rng);
    Vec out(N * C), rstd(N), dx(N * C, 0.5), dg(C, 0.25);  // both accumulate
    ref::rmsnorm_forward(out.data(), rstd.data(), x.data(), g.data(), N, C, 1e-5);
    ref::rmsnorm_backward(dx.data(), dg.data(), dout.data(), x.data(), g.data(), rstd.data(), N, C);
    auto fx = to_float(x), fg = to_float(g), fdout = to_float(dout);
    std::vector<float> fout(N * C), frstd(N), fdx(N * C, 0.5f), fdg(C, 0.25f);
    rmsnorm_forward(fout.data(), frstd.data(), fx.data(), fg.data(), N, C, 1e-5f);
    rmsnorm_backward(fdx.data(), fdg.data(), fdout.data(), fx.data(), fg.data(), frstd.data(), N, C);
    EXPECT_LT(max_rel_diff(fout, out), 1e-5) << N << "x" << C;
    EXPECT_LT(max_rel_diff(frstd, rstd), 1e-5);
    EXPECT_LT(max_rel_diff(fdx, dx), 1e-5);
    EXPECT_LT(max_rel_diff(fdg, dg), 1e-5);
  }
}

TEST(CpuKernels, RopeMatchesReferenceAndInverts) {
  std::mt19937 rng(32);
  const int positions = 300;
  for (auto [hs, theta] : {std::pair{8, 10000.0}, {64, 500000.0}}) {
    std::vector<float> cos((size_t)positions * hs / 2), sin(cos.size());
    const RopeScaling scaling{8, 1, 4, 64};  // Llama 3's, on a short original context
    rope_table(cos.data(), sin.data(), positions, hs, theta, scaling);
    std::vector<double> inv_freq(hs / 2);
    rope_inverse_frequencies(inv_freq.data(), hs, theta, scaling);
    const int B = 2, T = 130, heads = 3, ld = 5 * hs, pos0 = 7;
    Vec x = random_vec((size_t)B * T * ld, rng), want = x;
    ref::rope_rotate(want.data(), B * T, T, ld, heads, hs, inv_freq.data(), pos0, false);
    std::vector<float> got = to_float(x);
    rope_rotate(got.data(), B * T, T, ld, heads, hs, cos.data(), sin.data(), pos0, false);
    EXPECT_LT(max_rel_diff(got, want), 1e-5) << "hs=" << hs;
    rope_rotate(got.data(), B * T, T, ld, heads, hs, cos.data(), sin.data(), pos0, true);
    EXPECT_LT(max_rel_diff(got, x), 1e-5) << "the inverse turns back";
  }
}

// Llama 3's scaling, from its definition: with original context L and factors (8, 1, 4),
// wavelengths under L/4 keep their frequency, those over L are 8 times slower, and the
// smooth band between interpolates (continuous at both edges).
TEST(CpuKernels, RopeLlama3ScalingBands) {
  const int hs = 128;
  const double theta = 500000.0;
  const RopeScaling scaling{8, 1, 4, 8192};
  std::vector<double> plain(hs / 2), scaled(hs / 2);
  rope_inverse_frequencies(plain.data(), hs, theta, {});
  rope_inverse_frequencies(scaled.data(), hs, theta, scaling);
  int kept = 0, stretched = 0, between = 0;
  for (int i = 0; i < hs / 2; i++) {
    EXPECT_DOUBLE_EQ(plain[i], std::pow(theta, -2.0 * i / hs));
    const double wavelen = 2 * std::numbers::pi / plain[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], plain[i]);
      kept++;
    } else if (wavelen > 8192.0) {
      EXPECT_DOUBLE_EQ(scaled[i], plain[i] / 8);
      stretched++;
    } else {
      EXPECT_LT(scaled[i], plain[i]);
      EXPECT_GT(scaled[i], plain[i] / 8);
      between++;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(stretched, 0);
  EXPECT_GT(between, 0);
}

TEST(CpuKernels, SwiGluMatchesReference) {
  std::mt19937 rng(33);
  for (auto [N, F] : {std::pair{1, 1}, {7, 13}, {64, 1100}}) {
    Vec x = random_vec(N * 2 * F, rng, 3.0), dout = random_vec(N * F, rng), out(N * F), dx(N * 2 * F);
    ref::swiglu_forward(out.data(), x.data(), N, F);
    ref::swiglu_backward(dx.data(), x.data(), dout.data(), N, F);
    auto fx = to_float(x), fdout = to_float(dout);
    std::vector<float> fout(N * F), fdx(N * 2 * F, 9.0f);  // dinp is overwritten
    swiglu_forward(fout.data(), fx.data(), N, F);
    swiglu_backward(fdx.data(), fx.data(), fdout.data(), N, F);
    EXPECT_LT(max_rel_diff(fout, out), 1e-5) << N << "x" << F;
    EXPECT_LT(max_rel_diff(fdx, dx), 1e-5);
    std::vector<uint16_t> half(N * F);  // the bf16 form: the fp32 values, rounded
    swiglu_forward(half.data(), fx.data(), N, F);
    std::vector<uint16_t> rounded(N * F);
    to_bf16(fout.data(), rounded.data(), fout.size());
    EXPECT_EQ(half, rounded);
  }
}

struct GqaShape {
  int B, T, NH, NKV, hs;
  int C() const { return NH * hs; }
  int ld() const { return (NH + 2 * NKV) * hs; }
};
// GQA (groups of 2 and 4), MQA, and MHA; T past the kernels' 64-row query blocks.
const GqaShape kGqaShapes[] = {{2, 7, 4, 2, 3}, {1, 130, 8, 2, 16}, {2, 65, 6, 1, 8}, {1, 33, 4, 4, 8}};

// The same qkv rows as multi-head attention: each key/value head copied to every query
// head that shares it.
std::vector<float> expand_to_mha(const std::vector<float>& qkv, const GqaShape& s) {
  const int group = s.NH / s.NKV, C = s.C();
  std::vector<float> out((size_t)s.B * s.T * 3 * C);
  for (int n = 0; n < s.B * s.T; n++) {
    const float* src = qkv.data() + (size_t)n * s.ld();
    float* dst = out.data() + (size_t)n * 3 * C;
    std::copy(src, src + C, dst);
    for (int h = 0; h < s.NH; h++)
      for (int part = 1; part <= 2; part++)
        std::copy_n(src + C + (part - 1) * s.NKV * s.hs + (h / group) * s.hs, s.hs, dst + part * C + h * s.hs);
  }
  return out;
}

// A multi-head dqkv folded back: the query heads sharing a key/value head sum their dk, dv.
std::vector<float> fold_from_mha(const std::vector<float>& dqkv, const GqaShape& s) {
  const int group = s.NH / s.NKV, C = s.C();
  std::vector<float> out((size_t)s.B * s.T * s.ld(), 0.0f);
  for (int n = 0; n < s.B * s.T; n++) {
    const float* src = dqkv.data() + (size_t)n * 3 * C;
    float* dst = out.data() + (size_t)n * s.ld();
    std::copy(src, src + C, dst);
    for (int h = 0; h < s.NH; h++)
      for (int part = 1; part <= 2; part++)
        for (int d = 0; d < s.hs; d++)
          dst[C + (part - 1) * s.NKV * s.hs + (h / group) * s.hs + d] += src[part * C + h * s.hs + d];
  }
  return out;
}

struct AttentionResult {
  std::vector<float> out, lse, dqkv;
};
AttentionResult run_attention(const std::vector<float>& qkv, const std::vector<float>& dout, int B, int T, int C,
                              int NH, int NKV, Precision p) {
  AttentionResult r{std::vector<float>(dout.size()), std::vector<float>((size_t)B * NH * T),
                    std::vector<float>(qkv.size(), 7.0f)};  // garbage: must be overwritten
  attention_forward(r.out.data(), r.lse.data(), qkv.data(), B, T, C, NH, NKV, p);
  attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), B, T, C, NH, NKV, p);
  return r;
}

TEST(CpuKernels, GroupedQueryAttentionMatchesReference) {
  std::mt19937 rng(34);
  for (const GqaShape& s : kGqaShapes) {
    SCOPED_TRACE("NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV) + " T=" + std::to_string(s.T));
    const int N = s.B * s.T;
    Vec qkv = random_vec((size_t)N * s.ld(), rng), dout = random_vec((size_t)N * s.C(), rng);
    Vec out(dout.size()), lse((size_t)s.B * s.NH * s.T), dqkv(qkv.size());
    ref::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C(), s.NH, s.NKV);
    ref::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C(), s.NH,
                            s.NKV);
    const auto got = run_attention(to_float(qkv), to_float(dout), s.B, s.T, s.C(), s.NH, s.NKV, Precision::kFp32);
    EXPECT_LT(max_rel_diff(got.out, out), 1e-5);
    EXPECT_LT(max_rel_diff(got.lse, lse), 1e-5);
    EXPECT_LT(max_rel_diff(got.dqkv, dqkv), 1e-5);
  }
}

// Grouped-query attention is multi-head attention on duplicated key/value heads: the same
// products per query head, so the output and log-sum-exp have the same bits, in fp32 and in
// bf16. The shared heads' gradients sum in another order (one running sum over the group's
// heads, against per-head sums added afterwards): within 1e-6 of the largest.
TEST(CpuKernels, GroupedQueryAttentionEqualsMhaOnDuplicatedHeads) {
  std::mt19937 rng(35);
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    for (const GqaShape& s : kGqaShapes) {
      SCOPED_TRACE(std::string(precision_name(p)) + " NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV) +
                   " T=" + std::to_string(s.T));
      const int N = s.B * s.T;
      const auto qkv = to_float(random_vec((size_t)N * s.ld(), rng));
      const auto dout = to_float(random_vec((size_t)N * s.C(), rng));
      const auto gqa = run_attention(qkv, dout, s.B, s.T, s.C(), s.NH, s.NKV, p);
      const auto mha = run_attention(expand_to_mha(qkv, s), dout, s.B, s.T, s.C(), s.NH, s.NH, p);
      EXPECT_EQ(gqa.out, mha.out);
      EXPECT_EQ(gqa.lse, mha.lse);
      const auto folded = fold_from_mha(mha.dqkv, s);
      EXPECT_LT(max_rel_diff(gqa.dqkv, Vec(folded.begin(), folded.end())), 1e-6);
    }
  }
}

TEST(CpuKernels, CachedGroupedQueryAttentionMatchesTheWholeSequence) {
  std::mt19937 rng(36);
  const GqaShape s{1, 37, 6, 2, 4};
  const int C = s.C(), CK = s.NKV * s.hs, ld = s.ld();
  Vec qkv = random_vec((size_t)s.T * ld, rng);
  Vec full((size_t)s.T * C), lse((size_t)s.NH * s.T);
  ref::attention_forward(full.data(), lse.data(), qkv.data(), 1, s.T, C, s.NH, s.NKV);
  std::vector<float> k_cache((size_t)s.T * CK), v_cache(k_cache.size());
  for (int t = 0; t < s.T; t++)
    for (int c = 0; c < CK; c++) {
      k_cache[(size_t)t * CK + c] = (float)qkv[(size_t)t * ld + C + c];
      v_cache[(size_t)t * CK + c] = (float)qkv[(size_t)t * ld + C + CK + c];
    }
  const auto fqkv = to_float(qkv);
  for (auto [p, n] : {std::pair{0, s.T}, {0, 1}, {10, 1}, {36, 1}, {5, 17}}) {
    std::vector<float> out((size_t)n * C);
    attention_cached_forward(out.data(), fqkv.data() + (size_t)p * ld, ld, k_cache.data(), v_cache.data(), p, n, C,
                             s.NH, s.NKV);
    EXPECT_LT(max_rel_diff(out, Vec(full.begin() + (size_t)p * C, full.begin() + (size_t)(p + n) * C)), 1e-5)
        << "p=" << p << " n=" << n;
  }
}

}  // namespace
}  // namespace meshtrain::kernels::test_llama_kernels
