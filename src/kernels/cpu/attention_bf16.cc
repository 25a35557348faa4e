// Causal self-attention with bf16 GEMMs (--precision bf16): one task per (batch row, key/
// value head) packs its k and v, and each query head sharing them its q, into dense bf16
// [T, hs] blocks, and multiplies whole T x T score matrices on the bf16 units (AMX through
// oneDNN); past 1024 rows, tiles of 256 query rows against the keys they see, so that a
// thread's scores are 256 x T. The square costs twice the causal FLOPs, but one call per
// product and head replaces the fp32 kernel's many small blocked GEMMs, which ran at a
// fraction of even the fp32 peak. Softmax, its log-sum-exp
// and the row sums of backward stay fp32; the products' operands (q, k, v, P, dO, dS) are
// rounded to bf16 as PyTorch's autocast rounds them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/memory.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/qkv_layout.h"
#include "kernels/ops.h"

namespace meshtrain::kernels {

namespace {

// Rounds rows x hs values (row stride ld) into a dense bf16 block.
void pack_head(const float* x, int rows, int hs, int ld, uint16_t* out) {
  for (int r = 0; r < rows; r++) round_block_to_bf16(x + (size_t)r * ld, out + (size_t)r * hs, hs);
}

// Query rows per tile: sequences up to kWholeRows run as one tile (one whole product per
// head), longer ones in tiles of kTileRows, each against the keys its rows may see (the
// causal prefix): a thread's scores are kTileRows x T, never T x T (32 GB at T = 32768).
constexpr int kWholeRows = 1024, kTileRows = 256;
int tile_rows(int T) { return T <= kWholeRows ? T : kTileRows; }

// A thread's buffers for one head: dense bf16 q, k, v (and dO), fp32 products of one tile of
// query rows against its keys and their bf16 roundings. Kept per thread from call to call
// (grown to the largest seen): fresh pages on every call cost more than the products.
struct HeadScratch {
  Buffer<uint16_t> q, k, v, dout;
  Buffer<float> scores, dprobs;
  Buffer<uint16_t> probs16, dscores16;
  std::vector<float> row, dot;

  static HeadScratch& for_thread(int T, int hs) {
    thread_local HeadScratch h;
    h.ensure(T, hs);
    return h;
  }
  void ensure(int T, int hs) {
    const size_t head = (size_t)T * hs, tile = (size_t)tile_rows(T) * T;
    if (q.size() >= head && scores.size() >= tile) return;
    for (Buffer<uint16_t>* b : {&q, &k, &v, &dout}) b->allocate(MemCategory::kWorkspace, head);
    for (Buffer<float>* b : {&scores, &dprobs}) b->allocate(MemCategory::kWorkspace, tile);
    for (Buffer<uint16_t>* b : {&probs16, &dscores16}) b->allocate(MemCategory::kWorkspace, tile);
    row.assign(T, 0.0f);
    dot.assign(T, 0.0f);
  }
};

// Query rows [i0, i0 + rows) against keys [0, keys): the causal prefix they see.
struct Tile {
  int i0, rows, keys;
};

// Row i's work runs over its first padded(i, keys) columns, a whole number of 16-lane
// vectors where the row allows, the columns past i masked to zero: a scalar tail after the
// vector loop cost as much as the vectors themselves on rows of a few hundred keys.
constexpr int kLanes = 16;
int padded(int i, int keys) { return std::min(keys, (i + kLanes) / kLanes * kLanes); }

// Rounds row x[0, n) (zero past column i) into row16, and zeros (bf16 +0) up to `keys`.
void causal_row_bf16(const float* x, int n, int keys, uint16_t* row16) {
  round_block_to_bf16(x, row16, n);
  std::memset(row16 + n, 0, sizeof(uint16_t) * (keys - n));
}

// x[j] = exp(scale * s[j] - shift) for j <= i, 0 for i < j < n; returns their sum.
float causal_exp_row(const float* s, float scale, float shift, int i, int n, float* x) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; j++) {
    x[j] = j <= i ? fast_exp(scale * s[j] - shift) : 0.0f;
    sum += x[j];
  }
  return sum;
}

// Row i of the probabilities in bf16: exp(scale * s - lse_i) for j <= i, 0 beyond.
void probs_row_bf16(const float* s, float scale, float lse, int i, int keys, float* tmp, uint16_t* p16) {
  const int n = padded(i, keys);
  causal_exp_row(s, scale, lse, i, n, tmp);
  causal_row_bf16(tmp, n, keys, p16);
}

// For every (batch row, key/value head), split over the threads: packs the key/value
// head's k and v into the thread's scratch; then, for each query head sharing them in
// order, packs its q and, tile by tile (the last first when `last_first`: its keys are all
// of them, so the backward's sums over tiles start there), computes the tile's raw scores
// q k^T and calls body(scratch, b, head, tile, first), first telling the group's first head
// and its first tile (where the dK and dV products start the sums).
template <typename Body>
void for_each_head(const float* qkv, int B, int T, const QkvLayout& at, int NKV, bool last_first, Body body) {
  const int R = tile_rows(T), tiles = (T + R - 1) / R;
#pragma omp parallel
  {
    HeadScratch& h = HeadScratch::for_thread(T, at.hs);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int g = 0; g < NKV; g++) {
        pack_head(qkv + at.k_of_group(b, g, T), T, at.hs, at.ld, h.k.data());
        pack_head(qkv + at.k_of_group(b, g, T) + at.CK, T, at.hs, at.ld, h.v.data());
        for (int head = g * at.group; head < (g + 1) * at.group; head++) {
          pack_head(qkv + at.q(b, head, T), T, at.hs, at.ld, h.q.data());
          for (int n = 0; n < tiles; n++) {
            const int i0 = (last_first ? tiles - 1 - n : n) * R, rows = std::min(R, T - i0);
            const Tile tile{i0, rows, i0 + rows};
            gemm_bf16(false, true, rows, tile.keys, at.hs, h.q.data() + (size_t)i0 * at.hs, at.hs, h.k.data(),
                      at.hs, 0.0f, h.scores.data(), tile.keys);
            body(h, b, head, tile, head == g * at.group && n == 0);
          }
        }
      }
    }
  }
}

// Packs one head's dO rows into the thread's bf16 block and, while each row is in cache,
// its rowsum(dO * O) in fp32 (the softmax backward's per-row term).
void pack_dout(const float* dout, const float* out, int T, int hs, int ld, HeadScratch& h) {
  for (int t = 0; t < T; t++) {
    const float *d_o = dout + (size_t)t * ld, *o = out + (size_t)t * ld;
    round_block_to_bf16(d_o, h.dout.data() + (size_t)t * hs, hs);
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int d = 0; d < hs; d++) dot += d_o[d] * o[d];
    h.dot[t] = dot;
  }
}

}  // namespace

void attention_forward_bf16(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, int NKV) {
  const QkvLayout at(C, NH, NKV);
  const int hs = at.hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for_each_head(qkv, B, T, at, NKV, false, [&](HeadScratch& h, int b, int head, const Tile& tile, bool) {
    float* lse_bh = lse + ((size_t)b * NH + head) * T;
    const int keys = tile.keys;
    for (int r = 0; r < tile.rows; r++) {
      const int i = tile.i0 + r;
      const float* si = h.scores.data() + (size_t)r * keys;
      float* x = h.row.data();
      const int n = padded(i, keys);
      const float mx = scale * row_max(si, i + 1);  // scale > 0: the max of the scaled row
      const float sum = causal_exp_row(si, scale, mx, i, n, x);
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int j = 0; j < n; j++) x[j] *= inv;
      causal_row_bf16(x, n, keys, h.probs16.data() + (size_t)r * keys);
      lse_bh[i] = mx + std::log(sum);
    }
    gemm_bf16(false, false, tile.rows, hs, keys, h.probs16.data(), keys, h.v.data(), hs, 0.0f,
              out + at.out(b, head, T) + (size_t)tile.i0 * C, C);  // P v
  });
}

void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int B, int T, int C, int NH, int NKV) {
  const QkvLayout at(C, NH, NKV);
  const int hs = at.hs, ld = at.ld;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for_each_head(qkv, B, T, at, NKV, true, [&](HeadScratch& h, int b, int head, const Tile& tile, bool first) {
    const size_t out_offset = at.out(b, head, T);
    const int keys = tile.keys, i0 = tile.i0, rows = tile.rows;
    float* dq = dqkv + at.q(b, head, T) + (size_t)i0 * ld;
    // The shared key/value head's dk, dv columns: the group's first head's last tile (which
    // sees every key) writes them, every other tile adds (beta 1), in head and tile order.
    float* dk = dqkv + at.k_of_group(b, head / at.group, T);
    float* dv = dk + at.CK;
    const float beta = first ? 0.0f : 1.0f;
    if (i0 + rows == T) pack_dout(dout + out_offset, out + out_offset, T, hs, C, h);  // the head's first tile
    const uint16_t* dout16 = h.dout.data() + (size_t)i0 * hs;
    const float* lse_bh = lse + ((size_t)b * NH + head) * T;
    for (int r = 0; r < rows; r++)  // the probabilities again, from the scores and log-sum-exp
      probs_row_bf16(h.scores.data() + (size_t)r * keys, scale, lse_bh[i0 + r], i0 + r, keys, h.row.data(),
                     h.probs16.data() + (size_t)r * keys);
    float* dp = h.dprobs.data();
    gemm_bf16(true, false, keys, hs, rows, h.probs16.data(), keys, dout16, hs, beta, dv, ld);  // dV (+)= P^T dO
    gemm_bf16(false, true, rows, keys, hs, dout16, hs, h.v.data(), hs, 0.0f, dp, keys);  // dP = dO v^T
    for (int r = 0; r < rows; r++) {
      // dS = scale * P * (dP - rowsum(dO * O)); P as rounded, zero past column i.
      const int i = i0 + r, n = padded(i, keys);
      const float dot = h.dot[i];
      const uint16_t* pi = h.probs16.data() + (size_t)r * keys;
      const float* dpi = dp + (size_t)r * keys;
      float* x = h.row.data();
#pragma omp simd
      for (int j = 0; j < n; j++) x[j] = scale * bf16_value(pi[j]) * (dpi[j] - dot);
      causal_row_bf16(x, n, keys, h.dscores16.data() + (size_t)r * keys);
    }
    gemm_bf16(false, false, rows, hs, keys, h.dscores16.data(), keys, h.k.data(), hs, 0.0f, dq, ld);  // dQ = dS k
    gemm_bf16(true, false, keys, hs, rows, h.dscores16.data(), keys, h.q.data() + (size_t)i0 * hs, hs, beta, dk,
              ld);  // dK (+)= dS^T q
  });
}

}  // namespace meshtrain::kernels
