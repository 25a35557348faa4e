#include "model/context_parallel.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace meshtrain::model {

namespace k = meshtrain::kernels;

namespace {
constexpr int kTagKv = 11, kTagDkv = 12;
}  // namespace

void RingAttention::ensure(size_t kv, size_t out, size_t lse) {
  for (Buffer<float>* b : {&block_, &next_block_, &dblock_, &next_dblock_, &dpart_})
    if (b->size() != kv) b->allocate(MemCategory::kComm, kv);
  if (part_out_.size() != out) part_out_.allocate(MemCategory::kComm, out);
  if (part_lse_.size() != lse) part_lse_.allocate(MemCategory::kComm, lse);
}

void RingAttention::ranges_for(int owner, const DocumentRows& rows, const CpSplit& split, int B, int Tl) {
  const size_t N = (size_t)B * Tl;
  lo_.resize(N), hi_.resize(N);
  for (size_t i = 0; i < N; i++) {
    const int b = (int)(i / Tl);
    lo_[i] = split.keys_before(rows.key_begin[i], owner, T_, b);
    hi_[i] = std::max(lo_[i], split.keys_before(rows.key_end[i], owner, T_, b));
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
                            const DocumentRows& rows, const CpSplit& split) {
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
    ranges_for(owner, rows, split, B, Tl);
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

// The dK/dV sums travel with their blocks, one step behind the k, v: at step s a rank
// computes its share of the block's dK/dV into dpart_ while the sum so far (the previous
// ranks' shares) is on its way from prev, then adds it and sends the sum on. The sums'
// transfers thus overlap the next step's attention, as the k, v blocks' do, and only the
// last one home (the rank's own block, complete) is exposed. Two sum buffers take turns:
// one is received into while the other is still being sent.
void RingAttention::backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             int ld, int B, int NH, int NKV, int hs, const DocumentRows& rows, const CpSplit& split) {
  const int p = cp_.size(), r = cp_.rank(), Tl = T_ / p, C = NH * hs, CK = NKV * hs;
  const size_t N = (size_t)B * Tl, kv = N * 2 * CK;
  ensure(kv, N * C, (size_t)B * NH * Tl);
  std::fill(dqkv, dqkv + N * ld, 0.0f);  // dq adds over the blocks
  pack_kv(block_.data(), qkv, ld, C, CK, N);
  float *cur = block_.data(), *nxt = next_block_.data();
  float* sums[2] = {dblock_.data(), next_dblock_.data()};
  comm::RequestPtr sum_sent[2];  // each sum buffer's send still in flight
  for (int s = 0; s < p; s++) {
    const int owner = (r - s + p) % p;
    comm::RequestPtr send, recv;
    if (s + 1 < p) {
      send = cp_.isend(cur, kv, next(), kTagKv);
      recv = cp_.irecv(nxt, kv, prev(), kTagKv);
    }
    float* sum = sums[s % 2];
    if (sum_sent[s % 2]) sum_sent[s % 2]->wait();
    comm::RequestPtr sum_recv = s > 0 ? cp_.irecv(sum, kv, prev(), kTagDkv) : nullptr;
    float* share = s > 0 ? dpart_.data() : sum;  // the own block's share starts its sum
    ranges_for(owner, rows, split, B, Tl);
    const bool any = sees_any(lo_, hi_);
    if (any) {
      std::fill(share, share + kv, 0.0f);
      const k::AttentionBlock x{qkv, ld, cur, cur + CK, 2 * CK, B, Tl, Tl, NH, NKV, hs, lo_.data(), hi_.data()};
      k::attention_ranged_backward(dqkv, ld, share, share + CK, 2 * CK, dout, out, C, lse, x);
    }
    if (sum_recv) {
      sum_recv->wait();
      if (any) k::add_inplace(sum, share, kv);
    }
    sum_sent[s % 2] = cp_.isend(sum, kv, next(), kTagDkv);
    if (send) send->wait(), recv->wait(), std::swap(cur, nxt);
  }
  // The own block's sum, complete, comes home from prev.
  float* home = sums[p % 2];
  if (sum_sent[p % 2]) sum_sent[p % 2]->wait();
  cp_.irecv(home, kv, prev(), kTagDkv)->wait();
  sum_sent[(p + 1) % 2]->wait();
  for (size_t i = 0; i < N; i++) std::memcpy(dqkv + i * ld + C, home + i * 2 * CK, sizeof(float) * 2 * CK);
}

namespace {

// Between rank-major rows ([cp][B Tl] of `width` floats: each rank's local rows, as the
// collectives lay them out) and sequence order ([B][T]): `to_sequence` picks the direction.
void reorder_rows(float* ranks, float* whole, const CpSplit& split, int B, int T, size_t width, bool to_sequence) {
  const int cp = split.size, Tl = T / cp;
  for (int j = 0; j < cp; j++) {
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl; t++) {
        float* r = ranks + (((size_t)j * B + b) * Tl + t) * width;
        float* w = whole + ((size_t)b * T + split.sequence_index_of(j, t, T, b)) * width;
        if (to_sequence) std::memcpy(w, r, sizeof(float) * width);
        else std::memcpy(r, w, sizeof(float) * width);
      }
  }
}

}  // namespace

void GatherAttention::gather(const float* qkv, int ld, int B, int C, int CK, const CpSplit& split) {
  const int p = cp_.size(), Tl = T_ / p;
  const size_t N = (size_t)B * Tl, kv = N * 2 * CK;
  if (mine_.size() != kv) mine_.allocate(MemCategory::kComm, kv);
  if (ranks_.size() != kv * p) ranks_.allocate(MemCategory::kComm, kv * p);
  if (whole_.size() != kv * p) whole_.allocate(MemCategory::kComm, kv * p);
  pack_kv(mine_.data(), qkv, ld, C, CK, N);
  cp_.all_gather(mine_.data(), ranks_.data(), kv);
  reorder_rows(ranks_.data(), whole_.data(), split, B, T_, 2 * (size_t)CK, true);
}

k::AttentionBlock GatherAttention::block(const float* qkv, int ld, int B, int NH, int NKV, int hs,
                                         const DocumentRows& rows) const {
  const int CK = NKV * hs;
  // A local row's keys are [key_begin, key_end) in sequence indices: contiguous in whole_.
  return {qkv, ld, whole_.data(), whole_.data() + CK, 2 * CK, B, T_ / cp_.size(), T_, NH, NKV, hs,
          rows.key_begin.data(), rows.key_end.data()};
}

void GatherAttention::forward(float* out, float* lse, const float* qkv, int ld, int B, int NH, int NKV, int hs,
                              const DocumentRows& rows, const CpSplit& split) {
  gather(qkv, ld, B, NH * hs, NKV * hs, split);
  k::attention_ranged_forward(out, NH * hs, lse, block(qkv, ld, B, NH, NKV, hs, rows));
}

void GatherAttention::backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                               int ld, int B, int NH, int NKV, int hs, const DocumentRows& rows,
                               const CpSplit& split) {
  const int p = cp_.size(), Tl = T_ / p, C = NH * hs, CK = NKV * hs;
  const size_t N = (size_t)B * Tl, kv = N * 2 * CK;
  gather(qkv, ld, B, C, CK, split);
  std::fill(dqkv, dqkv + N * ld, 0.0f);
  // The keys' gradients in sequence order, then rank-major (into ranks_, free once whole_
  // holds the gathered keys) for the reduce-scatter.
  if (dwhole_.size() != kv * p) dwhole_.allocate(MemCategory::kComm, kv * p);
  std::fill(dwhole_.data(), dwhole_.data() + kv * p, 0.0f);
  k::attention_ranged_backward(dqkv, ld, dwhole_.data(), dwhole_.data() + CK, 2 * CK, dout, out, C, lse,
                               block(qkv, ld, B, NH, NKV, hs, rows));
  reorder_rows(ranks_.data(), dwhole_.data(), split, B, T_, 2 * (size_t)CK, false);
  cp_.reduce_scatter(ranks_.data(), mine_.data(), kv);
  for (size_t i = 0; i < N; i++) std::memcpy(dqkv + i * ld + C, mine_.data() + i * 2 * CK, sizeof(float) * 2 * CK);
}

}  // namespace meshtrain::model

namespace meshtrain::model {

namespace {

int width(const UlyssesAttention::Segments& segments) {
  int w = 0;
  for (const auto& s : segments) w += s.width;
  return w;
}

}  // namespace

DocumentRows UlyssesAttention::traded_rows(const DocumentRows* whole, int B, int T) const {
  if (across_) return local_rows(across_split(), whole, B, T);
  return whole ? *whole : DocumentRows{};
}

UlyssesAttention::Heads UlyssesAttention::heads_of(int j, int NH, int NKV) const {
  const int nq = NH / cp_.size(), q0 = j * nq, group = NH / NKV;
  const int kv0 = q0 / group, kv_end = (q0 + nq - 1) / group + 1;
  return {q0, nq, kv0, kv_end - kv0};
}

UlyssesAttention::Segments UlyssesAttention::qkv_columns(int j, int NH, int NKV, int hs) const {
  const Heads h = heads_of(j, NH, NKV);
  const int C = NH * hs, CK = NKV * hs;
  return {{h.q0 * hs, h.nq * hs}, {C + h.kv0 * hs, h.nkv * hs}, {C + CK + h.kv0 * hs, h.nkv * hs}};
}

UlyssesAttention::Segments UlyssesAttention::out_columns(int j, int NH, int NKV, int hs) const {
  const Heads h = heads_of(j, NH, NKV);
  return {{h.q0 * hs, h.nq * hs}};
}

void UlyssesAttention::to_whole(const float* local, int ld, int B, const std::vector<Segments>& cols, float* whole) {
  const int p = cp_.size(), Tl = T_ / p, W = width(cols[cp_.rank()]);
  const size_t Nl = (size_t)B * Tl, n = Nl * W;  // every rank's block is as wide as this one's
  for (int j = 0; j < p; j++) {
    float* block = send_.data() + j * n;
    for (size_t i = 0; i < Nl; i++) {
      float* row = block + i * W;
      for (const Segment& s : cols[j]) std::memcpy(row, local + i * ld + s.offset, sizeof(float) * s.width), row += s.width;
    }
  }
  cp_.all_to_all(send_.data(), recv_.data(), n);
  for (int i = 0; i < p; i++) {  // rank i's rows, at their places in the sequences
    const CpSplit split{p, i};
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl; t++)
        std::memcpy(whole + ((size_t)b * T_ + split.sequence_index(t, T_)) * W,
                    recv_.data() + i * n + ((size_t)b * Tl + t) * W, sizeof(float) * W);
  }
}

void UlyssesAttention::to_local(const float* whole, int B, const std::vector<Segments>& cols, float* local, int ld,
                                bool add) {
  const int p = cp_.size(), Tl = T_ / p, W = width(cols[cp_.rank()]);
  const size_t Nl = (size_t)B * Tl, n = Nl * W;
  for (int i = 0; i < p; i++) {
    const CpSplit split{p, i};
    for (int b = 0; b < B; b++)
      for (int t = 0; t < Tl; t++)
        std::memcpy(send_.data() + i * n + ((size_t)b * Tl + t) * W,
                    whole + ((size_t)b * T_ + split.sequence_index(t, T_)) * W, sizeof(float) * W);
  }
  cp_.all_to_all(send_.data(), recv_.data(), n);
  for (int j = 0; j < p; j++) {  // in rank order: replicated key/value heads sum in one order
    const float* block = recv_.data() + j * n;
    for (size_t i = 0; i < Nl; i++) {
      const float* row = block + i * W;
      for (const Segment& s : cols[j]) {
        float* dst = local + i * ld + s.offset;
        if (add) {
          for (int c = 0; c < s.width; c++) dst[c] += row[c];
        } else {
          std::memcpy(dst, row, sizeof(float) * s.width);
        }
        row += s.width;
      }
    }
  }
}

UlyssesAttention::Trade UlyssesAttention::prepare(int B, int NH, int NKV, int hs, bool backward) {
  const int p = cp_.size();
  Trade t{std::vector<Segments>(p), std::vector<Segments>(p), heads_of(cp_.rank(), NH, NKV), 0, 0, hs};
  for (int j = 0; j < p; j++) t.qkv_cols[j] = qkv_columns(j, NH, NKV, hs), t.out_cols[j] = out_columns(j, NH, NKV, hs);
  t.W = width(t.qkv_cols[cp_.rank()]), t.Cq = t.me.nq * hs;
  const size_t rows = (size_t)B * T_;
  auto size = [](Buffer<float>& b, size_t n) {
    if (b.size() != n) b.allocate(MemCategory::kComm, n);
  };
  for (Buffer<float>* b : {&send_, &recv_, &qkv_}) size(*b, rows * t.W);
  size(out_, rows * t.Cq);
  if (backward) size(dqkv_, rows * t.W), size(dout_, rows * t.Cq);
  return t;
}

k::AttentionBlock UlyssesAttention::ranged(const Trade& t, int B, const DocumentRows& whole) const {
  const float* q = qkv_.data();
  return {q, t.W, q + t.Cq, q + t.Cq + t.me.nkv * t.hs, t.W, B, T_, T_, t.me.nq, t.me.nkv, t.hs,
          whole.key_begin.data(), whole.key_end.data()};
}

void UlyssesAttention::forward(float* out, float* lse, const float* qkv, int ld, int B, int NH, int NKV, int hs,
                               const DocumentRows* whole, k::Precision precision) {
  const Trade t = prepare(B, NH, NKV, hs, /*backward=*/false);
  to_whole(qkv, ld, B, t.qkv_cols, qkv_.data());
  if (across_) across_->forward(out_.data(), lse, qkv_.data(), t.W, B, t.me.nq, t.me.nkv, hs, *whole, across_split());
  else if (whole) k::attention_ranged_forward(out_.data(), t.Cq, lse, ranged(t, B, *whole));
  else k::attention_forward(out_.data(), lse, qkv_.data(), B, T_, t.Cq, t.me.nq, t.me.nkv, precision);
  to_local(out_.data(), B, t.out_cols, out, NH * hs, /*add=*/false);
}

void UlyssesAttention::backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                                int ld, int B, int NH, int NKV, int hs, const DocumentRows* whole,
                                k::Precision precision) {
  const Trade t = prepare(B, NH, NKV, hs, /*backward=*/true);
  const size_t rows = (size_t)B * T_;
  // The traded copies again, from what the block stored.
  to_whole(qkv, ld, B, t.qkv_cols, qkv_.data());
  to_whole(out, NH * hs, B, t.out_cols, out_.data());
  to_whole(dout, NH * hs, B, t.out_cols, dout_.data());
  if (across_) {  // the ring overwrites the traded rows' dq, dk, dv
    across_->backward(dqkv_.data(), dout_.data(), qkv_.data(), out_.data(), lse, t.W, B, t.me.nq, t.me.nkv, hs,
                      *whole, across_split());
  } else if (whole) {
    std::fill(dqkv_.data(), dqkv_.data() + rows * t.W, 0.0f);
    const int kv = t.me.nkv * hs;
    k::attention_ranged_backward(dqkv_.data(), t.W, dqkv_.data() + t.Cq, dqkv_.data() + t.Cq + kv, t.W,
                                 dout_.data(), out_.data(), t.Cq, lse, ranged(t, B, *whole));
  } else {
    k::attention_backward(dqkv_.data(), dout_.data(), qkv_.data(), out_.data(), lse, B, T_, t.Cq, t.me.nq,
                          t.me.nkv, precision);
  }
  std::fill(dqkv, dqkv + (size_t)B * (T_ / cp_.size()) * ld, 0.0f);  // key/value heads of several ranks add
  to_local(dqkv_.data(), B, t.qkv_cols, dqkv, ld, /*add=*/true);
}

}  // namespace meshtrain::model
