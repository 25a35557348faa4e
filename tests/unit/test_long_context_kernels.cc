// The kernels under document masks and context parallelism (kernels/ops.h). Attention by
// key ranges: its naive reference checked by finite differences and against causal
// attention; the CPU kernel against the reference; splitting the keys into blocks and
// merging (a ring's steps) against the whole; and document-masked attention against
// PyTorch with an explicit mask (tests/reference/torch_masked_attention.py). Positions
// given per row (restarted at each document, or a context-parallel rank's places in the
// sequence): the embedding's and RoPE's, against their references and by finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"
#include "kernel_test_util.h"

namespace meshtrain::test_long_context_kernels {
namespace {

using namespace kernels;
using namespace kernels::test_util;

struct Shape {
  int B, n, NH, NKV, hs;
  int C() const { return NH * hs; }
  int CK() const { return NKV * hs; }
};

// Each row's visible keys under a document mask over a causal sequence: documents start at
// the given positions of every batch row (0 always starts one); row i sees [start(i), i+1).
struct Ranges {
  std::vector<int> lo, hi;
};
Ranges document_ranges(int B, int T, const std::vector<std::vector<int>>& starts) {
  Ranges r{std::vector<int>((size_t)B * T), std::vector<int>((size_t)B * T)};
  for (int b = 0; b < B; b++) {
    int start = 0;
    for (int i = 0; i < T; i++) {
      for (int s : starts[b % starts.size()])
        if (s == i) start = i;
      r.lo[(size_t)b * T + i] = start, r.hi[(size_t)b * T + i] = i + 1;
    }
  }
  return r;
}

// Separate q [B,n,C] and k, v [B,n,CK] tensors and their result, in double or float.
template <typename F>
struct Operands {
  std::vector<F> q, k, v, dout;
};
Operands<double> random_operands(const Shape& s, std::mt19937& rng) {
  const size_t N = (size_t)s.B * s.n;
  return {random_vec(N * s.C(), rng), random_vec(N * s.CK(), rng), random_vec(N * s.CK(), rng),
          random_vec(N * s.C(), rng)};
}
template <typename F>
std::vector<F> cast(const Vec& v) {
  return std::vector<F>(v.begin(), v.end());
}

template <typename F>
struct Result {
  std::vector<F> out, lse, dq, dk, dv;
};

Result<double> reference(const Operands<double>& x, const Shape& s, const Ranges& r) {
  const size_t N = (size_t)s.B * s.n;
  Result<double> res{Vec(N * s.C()), Vec((size_t)s.B * s.NH * s.n), Vec(N * s.C()), Vec(N * s.CK()),
                     Vec(N * s.CK())};
  const ref::RefAttentionBlock<double> blk{x.q.data(), s.C(), x.k.data(), x.v.data(), s.CK(),
                                           s.B,        s.n,   s.n,        s.NH,       s.NKV,
                                           s.hs,       r.lo.data(), r.hi.data()};
  ref::attention_ranged_forward(res.out.data(), s.C(), res.lse.data(), blk);
  ref::attention_ranged_backward(res.dq.data(), s.C(), res.dk.data(), res.dv.data(), s.CK(), x.dout.data(),
                                 res.out.data(), s.C(), res.lse.data(), blk);
  return res;
}

Result<float> kernel(const Operands<double>& x, const Shape& s, const Ranges& r) {
  const size_t N = (size_t)s.B * s.n;
  const auto q = cast<float>(x.q), k = cast<float>(x.k), v = cast<float>(x.v), dout = cast<float>(x.dout);
  Result<float> res{std::vector<float>(N * s.C(), 7.0f), std::vector<float>((size_t)s.B * s.NH * s.n),
                    std::vector<float>(N * s.C()), std::vector<float>(N * s.CK()),
                    std::vector<float>(N * s.CK())};
  const AttentionBlock blk{q.data(), s.C(), k.data(), v.data(), s.CK(), s.B, s.n, s.n, s.NH, s.NKV, s.hs,
                           r.lo.data(), r.hi.data()};
  attention_ranged_forward(res.out.data(), s.C(), res.lse.data(), blk);
  attention_ranged_backward(res.dq.data(), s.C(), res.dk.data(), res.dv.data(), s.CK(), dout.data(),
                            res.out.data(), s.C(), res.lse.data(), blk);
  return res;
}

// Finite differences through the reference under a document mask with grouped-query heads.
TEST(GradCheck, RangedAttention) {
  std::mt19937 rng(41);
  const Shape s{2, 7, 4, 2, 3};
  const Ranges r = document_ranges(s.B, s.n, {{0, 3}, {0, 1, 5}});
  Operands<double> x = random_operands(s, rng);
  Result<double> res = reference(x, s, r);
  auto loss = [&] {
    const ref::RefAttentionBlock<double> blk{x.q.data(), s.C(), x.k.data(), x.v.data(), s.CK(), s.B, s.n, s.n,
                                             s.NH, s.NKV, s.hs, r.lo.data(), r.hi.data()};
    Vec out(res.out.size()), lse(res.lse.size());
    ref::attention_ranged_forward(out.data(), s.C(), lse.data(), blk);
    return dot(out, x.dout);
  };
  expect_gradient(x.q, res.dq, loss, "q");
  expect_gradient(x.k, res.dk, loss, "k");
  expect_gradient(x.v, res.dv, loss, "v");
}

// With causal ranges [0, i+1) the ranged reference is causal attention, forward and
// backward, on the same numbers laid out as one qkv tensor.
TEST(RangedAttention, CausalRangesAreCausalAttention) {
  std::mt19937 rng(42);
  const Shape s{2, 9, 2, 2, 4};
  const Ranges r = document_ranges(s.B, s.n, {{0}});
  const Operands<double> x = random_operands(s, rng);
  const Result<double> got = reference(x, s, r);
  const int C = s.C(), ld = 3 * C, N = s.B * s.n;
  Vec qkv((size_t)N * ld), out((size_t)N * C), lse((size_t)s.B * s.NH * s.n), dqkv(qkv.size());
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) {
      qkv[(size_t)i * ld + c] = x.q[(size_t)i * C + c];
      qkv[(size_t)i * ld + C + c] = x.k[(size_t)i * C + c];
      qkv[(size_t)i * ld + 2 * C + c] = x.v[(size_t)i * C + c];
    }
  ref::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.n, C, s.NH, s.NH);
  ref::attention_backward(dqkv.data(), x.dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.n, C, s.NH,
                          s.NH);
  for (size_t i = 0; i < out.size(); i++) EXPECT_NEAR(got.out[i], out[i], 1e-12);
  for (size_t i = 0; i < lse.size(); i++) EXPECT_NEAR(got.lse[i], lse[i], 1e-12);
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) {
      EXPECT_NEAR(got.dq[(size_t)i * C + c], dqkv[(size_t)i * ld + c], 1e-12);
      EXPECT_NEAR(got.dk[(size_t)i * C + c], dqkv[(size_t)i * ld + C + c], 1e-12);
      EXPECT_NEAR(got.dv[(size_t)i * C + c], dqkv[(size_t)i * ld + 2 * C + c], 1e-12);
    }
}

// Random documents over sequences of several query blocks (64 rows), grouped and multi-query
// heads, and a row that sees no key at all (its range emptied): out 0, lse -inf, no gradient.
TEST(RangedAttention, KernelMatchesReference) {
  std::mt19937 rng(43);
  for (const Shape s : {Shape{1, 5, 2, 2, 4}, Shape{2, 150, 4, 2, 8}, Shape{1, 200, 4, 1, 16}}) {
    std::vector<std::vector<int>> starts(s.B);
    for (auto& row : starts)
      for (int i = 1; i < s.n; i++)
        if (rng() % 23 == 0) row.push_back(i);
    Ranges r = document_ranges(s.B, s.n, starts);
    r.hi[s.n / 2] = r.lo[s.n / 2];  // a row without keys
    const Operands<double> x = random_operands(s, rng);
    const Result<double> want = reference(x, s, r);
    const Result<float> got = kernel(x, s, r);
    EXPECT_LT(max_rel_diff(got.out, want.out), 1e-5) << "n=" << s.n;
    EXPECT_LT(max_rel_diff(got.dq, want.dq), 1e-5);
    EXPECT_LT(max_rel_diff(got.dk, want.dk), 1e-5);
    EXPECT_LT(max_rel_diff(got.dv, want.dv), 1e-5);
    for (size_t i = 0; i < want.lse.size(); i++) {
      if (std::isinf(want.lse[i])) {
        EXPECT_TRUE(std::isinf(got.lse[i]) && got.lse[i] < 0) << i;
      } else {
        EXPECT_NEAR(got.lse[i], want.lse[i], 1e-5 * (1 + std::abs(want.lse[i]))) << i;
      }
    }
    for (int h = 0; h < s.hs * s.NH; h++) EXPECT_EQ(got.out[(size_t)(s.n / 2) * s.C() + h], 0.0f);
  }
}

// A ring's steps: the keys split into blocks (here 3, of unequal sizes), each block's
// partial attention merged into the running result, equal the whole; and each block's
// backward, from the merged out and lse, adds its share so that the shares sum to the whole.
TEST(RangedAttention, KeyBlocksMergeToTheWhole) {
  std::mt19937 rng(44);
  const Shape s{2, 96, 4, 2, 8};
  const Ranges r = document_ranges(s.B, s.n, {{0, 40}, {0, 17, 70}});
  const Operands<double> x = random_operands(s, rng);
  const Result<float> whole = kernel(x, s, r);
  const auto q = cast<float>(x.q), k = cast<float>(x.k), v = cast<float>(x.v), dout = cast<float>(x.dout);
  const size_t N = (size_t)s.B * s.n;
  std::vector<float> out(N * s.C(), 0.0f), lse((size_t)s.B * s.NH * s.n, -INFINITY);
  std::vector<float> dq(N * s.C(), 0.0f), dk(N * s.CK(), 0.0f), dv(N * s.CK(), 0.0f);
  const int cuts[] = {0, 30, 61, 96};
  // Each block as its own tensors, as a ring step receives it; ranges relative to it.
  struct Block {
    std::vector<float> k, v, dk, dv;
    std::vector<int> lo, hi;
    int begin, m;
  };
  std::vector<Block> blocks;
  for (int c = 0; c < 3; c++) {
    Block bl;
    bl.begin = cuts[c], bl.m = cuts[c + 1] - cuts[c];
    for (int b = 0; b < s.B; b++)
      for (int j = 0; j < bl.m; j++)
        for (int d = 0; d < s.CK(); d++) {
          bl.k.push_back(k[((size_t)b * s.n + bl.begin + j) * s.CK() + d]);
          bl.v.push_back(v[((size_t)b * s.n + bl.begin + j) * s.CK() + d]);
        }
    bl.dk.assign(bl.k.size(), 0.0f), bl.dv.assign(bl.v.size(), 0.0f);
    for (size_t i = 0; i < N; i++) {
      bl.lo.push_back(std::clamp(r.lo[i] - bl.begin, 0, bl.m));
      bl.hi.push_back(std::clamp(r.hi[i] - bl.begin, bl.lo.back(), bl.m));
    }
    blocks.push_back(std::move(bl));
  }
  std::vector<float> part_out(N * s.C()), part_lse(lse.size());
  for (const Block& bl : blocks) {
    const AttentionBlock blk{q.data(), s.C(), bl.k.data(), bl.v.data(), s.CK(), s.B, s.n, bl.m, s.NH, s.NKV,
                             s.hs, bl.lo.data(), bl.hi.data()};
    attention_ranged_forward(part_out.data(), s.C(), part_lse.data(), blk);
    attention_merge(out.data(), lse.data(), part_out.data(), part_lse.data(), s.B, s.n, s.NH, s.hs, s.C());
  }
  const Vec whole_out(whole.out.begin(), whole.out.end()), whole_lse(whole.lse.begin(), whole.lse.end());
  EXPECT_LT(max_rel_diff(out, whole_out), 1e-5);
  EXPECT_LT(max_rel_diff(lse, whole_lse), 1e-5);
  for (Block& bl : blocks) {
    const AttentionBlock blk{q.data(), s.C(), bl.k.data(), bl.v.data(), s.CK(), s.B, s.n, bl.m, s.NH, s.NKV,
                             s.hs, bl.lo.data(), bl.hi.data()};
    attention_ranged_backward(dq.data(), s.C(), bl.dk.data(), bl.dv.data(), s.CK(), dout.data(), out.data(),
                              s.C(), lse.data(), blk);
    for (int b = 0; b < s.B; b++)
      for (int j = 0; j < bl.m; j++)
        for (int d = 0; d < s.CK(); d++) {
          dk[((size_t)b * s.n + bl.begin + j) * s.CK() + d] = bl.dk[((size_t)b * bl.m + j) * s.CK() + d];
          dv[((size_t)b * s.n + bl.begin + j) * s.CK() + d] = bl.dv[((size_t)b * bl.m + j) * s.CK() + d];
        }
  }
  EXPECT_LT(max_rel_diff(dq, Vec(whole.dq.begin(), whole.dq.end())), 1e-5);
  EXPECT_LT(max_rel_diff(dk, Vec(whole.dk.begin(), whole.dk.end())), 1e-5);
  EXPECT_LT(max_rel_diff(dv, Vec(whole.dv.begin(), whole.dv.end())), 1e-5);
}

// Writes doubles as raw little-endian float64 for the Python side.
void write_doubles(const std::string& path, const Vec& v) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(v.data(), sizeof(double), v.size(), f), v.size());
  std::fclose(f);
}
Vec read_doubles(const std::string& path, size_t n) {
  Vec v(n);
  FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (!f) return v;
  EXPECT_EQ(std::fread(v.data(), sizeof(double), n, f), n) << path;
  std::fclose(f);
  return v;
}

// PyTorch (float64, autograd) with an explicit [T, T] boolean mask built from the documents'
// boundaries: the CPU kernel's output and gradients agree within 1e-5.
TEST(TorchReference, DocumentMaskedAttention) {
  std::mt19937 rng(45);
  const Shape s{2, 80, 4, 2, 8};
  const std::vector<std::vector<int>> starts = {{0, 11, 12, 50}, {0, 33}};
  const Ranges r = document_ranges(s.B, s.n, starts);
  const Operands<double> x = random_operands(s, rng);
  const Result<float> got = kernel(x, s, r);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("meshtrain_masked_attention_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  write_doubles(dir + "/q.bin", x.q), write_doubles(dir + "/k.bin", x.k), write_doubles(dir + "/v.bin", x.v);
  write_doubles(dir + "/dout.bin", x.dout);
  Vec lo(r.lo.begin(), r.lo.end());
  write_doubles(dir + "/doc_start.bin", lo);
  const std::string cmd = "/usr/bin/python3 " MESHTRAIN_SOURCE_DIR "/tests/reference/torch_masked_attention.py " +
                          dir + " " + std::to_string(s.B) + " " + std::to_string(s.n) + " " +
                          std::to_string(s.NH) + " " + std::to_string(s.NKV) + " " + std::to_string(s.hs);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "reference failed: " << cmd;
  const size_t N = (size_t)s.B * s.n;
  EXPECT_LT(max_rel_diff(got.out, read_doubles(dir + "/out.bin", N * s.C())), 1e-5);
  EXPECT_LT(max_rel_diff(got.dq, read_doubles(dir + "/dq.bin", N * s.C())), 1e-5);
  EXPECT_LT(max_rel_diff(got.dk, read_doubles(dir + "/dk.bin", N * s.CK())), 1e-5);
  EXPECT_LT(max_rel_diff(got.dv, read_doubles(dir + "/dv.bin", N * s.CK())), 1e-5);
  std::filesystem::remove_all(dir);
}

// Positions restarting at each document: rows 0..4 at 0..4, then 0..2, then 0..3 (B = 2, T = 6).
const std::vector<int> kRestarted = {0, 1, 2, 3, 4, 0, 0, 1, 2, 0, 1, 2};

TEST(GradCheck, EncoderAtPositions) {
  std::mt19937 rng(46);
  const int B = 2, T = 6, C = 5, V = 7;
  const std::vector<int> inp = {1, 3, 3, 0, 6, 1, 2, 2, 5, 4, 0, 6};
  Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), w = random_vec(B * T * C, rng);
  Vec out(B * T * C);
  auto loss = [&] {
    ref::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C, 0, V, kRestarted.data());
    return dot(out, w);
  };
  Vec dwte(V * C), dwpe(T * C);
  ref::encoder_backward(dwte.data(), dwpe.data(), w.data(), inp.data(), B, T, C, 0, V, kRestarted.data());
  expect_gradient(wte, dwte, loss, "wte");
  expect_gradient(wpe, dwpe, loss, "wpe");
  for (int c = 0; c < C; c++) EXPECT_EQ(dwpe[5 * C + c], 0.0) << "position 5 is never used";
}

TEST(GradCheck, RopeAtPositions) {
  std::mt19937 rng(47);
  const int N = 12, heads = 2, hs = 8, ld = heads * hs + 3;
  std::vector<double> inv_freq(hs / 2);
  rope_inverse_frequencies(inv_freq.data(), hs, 10000.0, {});
  Vec x = random_vec(N * ld, rng), w = random_vec(N * ld, rng);
  auto loss = [&] {
    Vec y = x;
    ref::rope_rotate(y.data(), N, N, ld, heads, hs, inv_freq.data(), 0, false, kRestarted.data());
    return dot(y, w);
  };
  Vec dx = w;
  ref::rope_rotate(dx.data(), N, N, ld, heads, hs, inv_freq.data(), 0, true, kRestarted.data());
  expect_gradient(x, dx, loss, "x");
}

// The CPU kernels at given positions against their references; and positions equal to the
// default ones (t, or pos0 + t) give the very bits of the default path.
TEST(CpuKernels, EmbeddingAndRopeAtPositions) {
  std::mt19937 rng(48);
  const int B = 2, T = 6, C = 16, V = 11, N = B * T;
  std::vector<int> inp(N), natural(N);
  for (auto& i : inp) i = rng() % V;
  for (int n = 0; n < N; n++) natural[n] = n % T;
  const Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), dout = random_vec(N * C, rng);
  Vec out(N * C), dwte(V * C), dwpe(T * C);
  ref::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C, 0, V, kRestarted.data());
  ref::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C, 0, V, kRestarted.data());
  const auto fwte = to_float(wte), fwpe = to_float(wpe), fdout = to_float(dout);
  std::vector<float> fout(N * C), fdwte(V * C), fdwpe(T * C), plain(N * C), plain_dwpe(T * C), plain_dwte(V * C);
  encoder_forward(fout.data(), inp.data(), fwte.data(), fwpe.data(), B, T, C, 0, V, kRestarted.data());
  encoder_backward(fdwte.data(), fdwpe.data(), fdout.data(), inp.data(), B, T, C, 0, V, kRestarted.data());
  EXPECT_LT(max_rel_diff(fout, out), 1e-6);
  EXPECT_LT(max_rel_diff(fdwte, dwte), 1e-6);
  EXPECT_LT(max_rel_diff(fdwpe, dwpe), 1e-6);
  encoder_forward(fout.data(), inp.data(), fwte.data(), fwpe.data(), B, T, C, 0, V, natural.data());
  encoder_forward(plain.data(), inp.data(), fwte.data(), fwpe.data(), B, T, C, 0, V);
  EXPECT_EQ(fout, plain);
  std::fill(fdwpe.begin(), fdwpe.end(), 0.0f), std::fill(fdwte.begin(), fdwte.end(), 0.0f);
  encoder_backward(fdwte.data(), fdwpe.data(), fdout.data(), inp.data(), B, T, C, 0, V, natural.data());
  encoder_backward(plain_dwte.data(), plain_dwpe.data(), fdout.data(), inp.data(), B, T, C, 0, V);
  EXPECT_EQ(fdwpe, plain_dwpe);

  const int heads = 2, hs = 8, ld = heads * hs, positions = 64;
  std::vector<float> cos((size_t)positions * hs / 2), sin(cos.size());
  rope_table(cos.data(), sin.data(), positions, hs, 10000.0, {});
  std::vector<double> inv_freq(hs / 2);
  rope_inverse_frequencies(inv_freq.data(), hs, 10000.0, {});
  const Vec x = random_vec(N * ld, rng);
  Vec want = x;
  ref::rope_rotate(want.data(), N, T, ld, heads, hs, inv_freq.data(), 0, false, kRestarted.data());
  std::vector<float> got = to_float(x), shifted = to_float(x), at_shift = to_float(x);
  rope_rotate(got.data(), N, T, ld, heads, hs, cos.data(), sin.data(), 0, false, kRestarted.data());
  EXPECT_LT(max_rel_diff(got, want), 1e-5);
  std::vector<int> plus7(N);
  for (int n = 0; n < N; n++) plus7[n] = 7 + n % T;
  rope_rotate(shifted.data(), N, T, ld, heads, hs, cos.data(), sin.data(), 7, false);
  rope_rotate(at_shift.data(), N, T, ld, heads, hs, cos.data(), sin.data(), 0, false, plus7.data());
  EXPECT_EQ(shifted, at_shift);
}

}  // namespace
}  // namespace meshtrain::test_long_context_kernels
