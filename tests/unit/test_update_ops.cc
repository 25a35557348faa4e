// The optimizer's and the compressed collectives' ops (kernels/cpu/adamw.cc, int8_blocks.cc,
// onebit.cc) against their naive references (kernels/ref/optim_ref.h): the same arithmetic
// in the same order, so equal bit for bit, on sizes around the ops' blocks and their
// thresholds for using the threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"
#include "kernels/ref/optim_ref.h"

namespace meshtrain::kernels::test_update_ops {
namespace {

using test_util::random_vec;
using test_util::to_float;

// Sizes below, at and above the blocks (2048, 8 values a byte) and the thread thresholds.
const std::vector<size_t> kSizes = {0, 1, 7, 8, 9, 2047, 2048, 2049, 8192 + 13, 70001};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // (An empty vector's data() may be null, which memcmp must not get.)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(CpuKernels, AdamWUpdateMatchesReferenceBitForBit) {
  std::mt19937 rng(61);
  for (size_t n : kSizes)
    for (float decay : {1.0f, 1.0f - 6e-4f * 0.1f}) {
      auto p = to_float(random_vec(n, rng)), g = to_float(random_vec(n, rng, 1e-2));
      auto m = to_float(random_vec(n, rng, 1e-3)), v = to_float(random_vec(n, rng, 1e-5));
      for (float& x : v) x = std::abs(x);
      auto rp = p, rm = m, rv = v;
      const AdamWScalars s{0.9f, 0.95f, 1e-8f, 6e-4f / 0.19f, std::sqrt(0.0975f), decay};
      for (int step = 0; step < 3; step++) {
        adamw_update(p.data(), g.data(), m.data(), v.data(), n, s);
        ref::adamw_update(rp.data(), g.data(), rm.data(), rv.data(), n, s.b1, s.b2, s.eps, s.step_size,
                          s.bias2_sqrt, s.decay);
      }
      EXPECT_TRUE(same_bits(p, rp) && same_bits(m, rm) && same_bits(v, rv)) << "n " << n << " decay " << decay;
    }
}

// A caller that splits the work over its own threads (the 16-bit updates do) gets the
// values of one call over the whole array.
TEST(CpuKernels, AdamWUpdateInsideAParallelRegionEqualsOneCall) {
  std::mt19937 rng(62);
  const size_t n = 70001, piece = 2048;
  auto p = to_float(random_vec(n, rng)), g = to_float(random_vec(n, rng)), m = to_float(random_vec(n, rng));
  std::vector<float> v(n, 1e-4f);
  auto wp = p, wm = m, wv = v;
  const AdamWScalars s{0.9f, 0.999f, 1e-8f, 1e-3f, 0.5f, 0.9999f};
  adamw_update(wp.data(), g.data(), wm.data(), wv.data(), n, s);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += piece) {
    const size_t k = std::min(piece, n - b);
    adamw_update(p.data() + b, g.data() + b, m.data() + b, v.data() + b, k, s);
  }
  EXPECT_TRUE(same_bits(p, wp) && same_bits(m, wm) && same_bits(v, wv));
}

// The 16-bit update in one pass equals the four passes it replaces (widen, scale, update,
// round) and the naive reference of each, bit for bit, in bf16 and fp16, with and without
// the gradient factor; the master weights, both moments and the 16-bit weights.
TEST(CpuKernels, AdamWUpdateHalfEqualsItsPassesBitForBit) {
  std::mt19937 rng(64);
  for (Precision p : {Precision::kBf16, Precision::kFp16})
    for (size_t n : kSizes)
      for (float coef : {1.0f, 0.37f}) {
        std::vector<uint16_t> g16(n), p16(n), ref16(n);
        to_half(p, to_float(random_vec(n, rng, 1e-2)).data(), g16.data(), n);
        auto w = to_float(random_vec(n, rng)), m = to_float(random_vec(n, rng, 1e-3));
        auto v = to_float(random_vec(n, rng, 1e-5));
        for (float& x : v) x = std::abs(x);
        auto rw = w, rm = m, rv = v;
        const AdamWScalars s{0.9f, 0.95f, 1e-8f, 6e-4f / 0.19f, std::sqrt(0.0975f), 1.0f - 6e-5f};
        for (int step = 0; step < 2; step++) {
          adamw_update_half(p, g16.data(), coef, w.data(), m.data(), v.data(), p16.data(), n, s);
          std::vector<float> g(n);
          from_half(p, g16.data(), g.data(), n);
          if (coef != 1.0f) ref::scale_inplace(g.data(), n, coef);
          ref::adamw_update(rw.data(), g.data(), rm.data(), rv.data(), n, s.b1, s.b2, s.eps, s.step_size,
                            s.bias2_sqrt, s.decay);
          to_half(p, rw.data(), ref16.data(), n);
        }
        EXPECT_TRUE(same_bits(w, rw) && same_bits(m, rm) && same_bits(v, rv))
            << precision_name(p) << " n " << n << " coef " << coef;
        EXPECT_TRUE(p16 == ref16) << precision_name(p) << " n " << n << " coef " << coef;
      }
}

TEST(CpuKernels, ScaleInplaceMatchesReferenceBitForBit) {
  std::mt19937 rng(63);
  for (size_t n : kSizes)
    for (float factor : {0.5f, 0.37f, 1e-30f}) {
      const auto before = to_float(random_vec(n, rng));
      auto x = before, r = before;
      scale_inplace(x.data(), n, factor);
      ref::scale_inplace(r.data(), n, factor);
      EXPECT_TRUE(same_bits(x, r)) << n << " x " << factor;
      if (factor == 0.5f) {  // a power of two scales exactly: each value is halved
        for (size_t i = 0; i < n; i++) ASSERT_EQ(x[i] * 2.0f, before[i]) << i;
      }
    }
}

TEST(CpuKernels, AdamWPreconditionedUpdateMatchesReferenceBitForBit) {
  std::mt19937 rng(63);
  for (size_t n : kSizes) {
    auto p = to_float(random_vec(n, rng)), u = to_float(random_vec(n, rng));
    auto rp = p;
    adamw_preconditioned_update(p.data(), u.data(), n, 0.99994f, 3e-3f);
    ref::adamw_preconditioned_update(rp.data(), u.data(), n, 0.99994f, 3e-3f);
    EXPECT_TRUE(same_bits(p, rp)) << "n " << n;
  }
}

// Random values with a block of zeros, a block holding an infinity and one a NaN, and
// values exactly half-way between two codes (ties away from zero).
std::vector<float> int8_input(size_t n, size_t block, std::mt19937& rng) {
  auto x = to_float(random_vec(n, rng, 3.0));
  if (n >= 4 * block) {
    std::fill(x.begin(), x.begin() + block, 0.f);
    x[block + 1] = INFINITY;
    x[2 * block + 2] = NAN;
    x[3 * block] = 127.f, x[3 * block + 1] = 0.5f, x[3 * block + 2] = -2.5f;
  }
  return x;
}

TEST(CpuKernels, Int8BlocksMatchReferenceBitForBit) {
  std::mt19937 rng(64);
  for (size_t n : kSizes)
    for (size_t block : {1, 7, 256}) {
      const auto x = int8_input(n, block, rng);
      const size_t bytes = (n + block - 1) / block * sizeof(float) + n;
      std::vector<uint8_t> q(bytes), rq(bytes, 0xAB);
      quantize_int8(x.data(), n, block, q.data());
      ref::quantize_int8(x.data(), n, block, rq.data());
      EXPECT_EQ(q, rq) << "n " << n << " block " << block;
      for (bool accumulate : {false, true}) {
        auto out = to_float(random_vec(n, rng)), rout = out;
        dequantize_int8(q.data(), n, block, out.data(), accumulate);
        ref::dequantize_int8(q.data(), n, block, rout.data(), accumulate);
        EXPECT_TRUE(same_bits(out, rout)) << "n " << n << " block " << block << " accumulate " << accumulate;
      }
    }
}

TEST(CpuKernels, OneBitPackAndUnpackMatchReferenceBitForBit) {
  std::mt19937 rng(65);
  for (size_t n : kSizes) {
    auto error = to_float(random_vec(n, rng)), x = to_float(random_vec(n, rng));
    if (n > 2) error[1] = 0.f, error[2] = -0.f;  // zero is positive; so is -0 (>= 0)
    auto rerror = error;
    add_inplace(error.data(), x.data(), n);
    ref::residual_forward(rerror.data(), rerror.data(), x.data(), n);
    ASSERT_TRUE(same_bits(error, rerror)) << "n " << n;
    const float scale = 0.75f;
    std::vector<uint8_t> signs((n + 7) / 8, 0xFF), rsigns((n + 7) / 8);
    onebit_pack(error.data(), n, scale, signs.data());
    ref::onebit_pack(rerror.data(), n, scale, rsigns.data());
    EXPECT_EQ(signs, rsigns) << "n " << n;
    EXPECT_TRUE(same_bits(error, rerror)) << "n " << n;
    for (bool accumulate : {false, true}) {
      auto out = to_float(random_vec(n, rng)), rout = out;
      onebit_unpack(signs.data(), n, scale, out.data(), accumulate);
      ref::onebit_unpack(signs.data(), n, scale, rout.data(), accumulate);
      EXPECT_TRUE(same_bits(out, rout)) << "n " << n << " accumulate " << accumulate;
    }
  }
}

}  // namespace
}  // namespace meshtrain::kernels::test_update_ops
