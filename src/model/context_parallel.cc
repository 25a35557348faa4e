#include "model/context_parallel.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace meshtrain::model {

namespace k = meshtrain::kernels;

namespace {
constexpr int kTagKv = 11, kTagDkv = 12;
}  // namespace

int CpSplit::sequence_index(int t, int T) const {
  const int c = chunk(T);
  return t < c ? rank * c + t : (2 * size - 1 - rank) * c + (t - c);
}

int CpSplit::keys_before(int x, int owner, int T) const {
  const int c = chunk(T), early = owner * c, late = (2 * size - 1 - owner) * c;
  return std::clamp(x - early, 0, c) + std::clamp(x - late, 0, c);
}

std::vector<int> CpSplit::take(const int* full, int B, int T) const {
  const int Tl = local(T);
  std::vector<int> out((size_t)B * Tl);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tl; t++) out[(size_t)b * Tl + t] = full[(size_t)b * T + sequence_index(t, T)];
  return out;
}

DocumentRows local_rows(const CpSplit& split, const DocumentRows* whole, int B, int T) {
  const int Tl = split.local(T);
  DocumentRows rows;
  const size_t N = (size_t)B * Tl;
  rows.positions.resize(N), rows.key_begin.resize(N), rows.key_end.resize(N);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tl; t++) {
      const size_t i = (size_t)b * Tl + t;
      const int g = split.sequence_index(t, T);
      rows.positions[i] = whole ? whole->positions[(size_t)b * T + g] : g;
      rows.key_begin[i] = whole ? whole->key_begin[(size_t)b * T + g] : 0;
      rows.key_end[i] = g + 1;
    }
  return rows;
}

void RingAttention::ensure(size_t kv, size_t out, size_t lse) {
  for (Buffer<float>* b : {&block_, &next_block_, &dblock_, &next_dblock_})
    if (b->size() != kv) b->allocate(MemCategory::kComm, kv);
  if (part_out_.size() != out) part_out_.allocate(MemCategory::kComm, out);
  if (part_lse_.size() != lse) part_lse_.allocate(MemCategory::kComm, lse);
}

void RingAttention::ranges_for(int owner, const DocumentRows& rows, int B, int Tl) {
  const CpSplit split{cp_.size(), cp_.rank()};
  const size_t N = (size_t)B * Tl;
  lo_.resize(N), hi_.resize(N);
  for (size_t i = 0; i < N; i++) {
    lo_[i] = split.keys_before(rows.key_begin[i], owner, T_);
    hi_[i] = std::max(lo_[i], split.keys_before(rows.key_end[i], owner, T_));
  }
}

namespace {

// Whether any row sees a key of the block (else its attention and merge are skipped).
bool sees_any(const std::vector<int>& lo, const std::vector<int>& hi) {
  for (size_t i = 0; i < lo.size(); i++)
    if (hi[i] > lo[i]) return true;
  return false;
}

// k and v of each row (adjacent in qkv: k at column C, v at C + CK) into a block of 2CK per row.
void pack_kv(float* block, const float* qkv, int ld, int C, int CK, size_t N) {
  for (size_t i = 0; i < N; i++) std::memcpy(block + i * 2 * CK, qkv + i * ld + C, sizeof(float) * 2 * CK);
}

}  // namespace

void RingAttention::forward(float* out, float* lse, const float* qkv, int ld, int B, int NH, int NKV, int hs,
                            const DocumentRows& rows) {
  const int p = cp_.size(), r = cp_.rank(), Tl = T_ / p, C = NH * hs, CK = NKV * hs;
  const size_t N = (size_t)B * Tl, kv = N * 2 * CK;
  ensure(kv, N * C, (size_t)B * NH * Tl);
  pack_kv(block_.data(), qkv, ld, C, CK, N);
  float *cur = block_.data(), *nxt = next_block_.data();
  for (int s = 0; s < p; s++) {
    const int owner = (r - s + p) % p;
    comm::RequestPtr send, recv;
    if (s + 1 < p) {  // the next block travels while this one is attended to
      send = cp_.isend(cur, kv, next(), kTagKv);
      recv = cp_.irecv(nxt, kv, prev(), kTagKv);
    }
    ranges_for(owner, rows, B, Tl);
    const k::AttentionBlock x{qkv, ld, cur, cur + CK, 2 * CK, B, Tl, Tl, NH, NKV, hs, lo_.data(), hi_.data()};
    if (s == 0) {
      k::attention_ranged_forward(out, C, lse, x);  // its own keys: every row sees itself
    } else if (sees_any(lo_, hi_)) {
      k::attention_ranged_forward(part_out_.data(), C, part_lse_.data(), x);
      k::attention_merge(out, lse, part_out_.data(), part_lse_.data(), B, Tl, NH, hs, C);
    }
    if (send) send->wait(), recv->wait(), std::swap(cur, nxt);
  }
}

void RingAttention::backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             int ld, int B, int NH, int NKV, int hs, const DocumentRows& rows) {
  const int p = cp_.size(), r = cp_.rank(), Tl = T_ / p, C = NH * hs, CK = NKV * hs;
  const size_t N = (size_t)B * Tl, kv = N * 2 * CK;
  ensure(kv, N * C, (size_t)B * NH * Tl);
  std::fill(dqkv, dqkv + N * ld, 0.0f);  // dq adds over the blocks
  pack_kv(block_.data(), qkv, ld, C, CK, N);
  std::fill(dblock_.data(), dblock_.data() + kv, 0.0f);
  float *cur = block_.data(), *nxt = next_block_.data();
  float *dcur = dblock_.data(), *dnxt = next_dblock_.data();
  for (int s = 0; s < p; s++) {
    const int owner = (r - s + p) % p;
    comm::RequestPtr send, recv;
    if (s + 1 < p) {
      send = cp_.isend(cur, kv, next(), kTagKv);
      recv = cp_.irecv(nxt, kv, prev(), kTagKv);
    }
    ranges_for(owner, rows, B, Tl);
    if (sees_any(lo_, hi_)) {
      const k::AttentionBlock x{qkv, ld, cur, cur + CK, 2 * CK, B, Tl, Tl, NH, NKV, hs, lo_.data(), hi_.data()};
      k::attention_ranged_backward(dqkv, ld, dcur, dcur + CK, 2 * CK, dout, out, C, lse, x);
    }
    // The block's dk, dv so far go on with it; after p steps each is back at its own rank.
    comm::RequestPtr dsend = cp_.isend(dcur, kv, next(), kTagDkv);
    comm::RequestPtr drecv = cp_.irecv(dnxt, kv, prev(), kTagDkv);
    dsend->wait(), drecv->wait();
    std::swap(dcur, dnxt);
    if (send) send->wait(), recv->wait(), std::swap(cur, nxt);
  }
  for (size_t i = 0; i < N; i++) std::memcpy(dqkv + i * ld + C, dcur + i * 2 * CK, sizeof(float) * 2 * CK);
}

}  // namespace meshtrain::model
