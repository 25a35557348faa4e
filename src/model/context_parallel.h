// Context parallelism (--cp N, docs/long_context.md): each sequence split over the N ranks of
// the cp group. Everything outside attention runs on a rank's own tokens at their places
// in the sequence; attention sees every key it may through the ring below.
//
// The split balances causal attention (Megatron-Core's): the sequence of T tokens is cut
// into 2N chunks of T/(2N), and rank r holds chunks r and 2N-1-r, an early chunk whose
// queries see few keys and a late one whose queries see many.
//
// Ring attention: each rank's k and v (one block) travel around the cp ranks point to point,
// the next block's transfer posted before the current block's attention runs so that it
// overlaps it; each block's partial output joins the rank's by the log-sum-exp
// (kernels::attention_merge). Backward sends the blocks around again, each with the sum of
// its dk and dv so far, which ends at the block's own rank after N steps. A block that no
// row of the rank sees (an earlier rank's late chunk seen by an early chunk, or another
// document) is skipped by the kernel's key ranges.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "core/memory.h"
#include "core/status.h"
#include "kernels/ops.h"
#include "model/cp_comm.h"
#include "model/cp_split.h"
#include "model/document_rows.h"

namespace meshtrain::model {

// The groups cp attention runs over (comm::Mesh's): under --cp-comm hybrid, the all-to-all
// group and the ring group inside cp; else null.
struct CpGroups {
  comm::Group* cp = nullptr;
  comm::Group* a2a = nullptr;
  comm::Group* ring = nullptr;
};

// Ring attention over the cp group for one rank's heads. Buffers are communication memory,
// sized on first use for B x T/cp rows.
class RingAttention {
 public:
  explicit RingAttention(comm::Group& cp) : cp_(cp) {}
  // Attention of this rank's rows: q, k, v in qkv [B, Tl, ld] (q at column 0, k at C, v at
  // C + CK), out [B, Tl, C] and lse [B, NH, Tl]; `rows` the rank's rows (local_rows) of
  // `split` (over this ring's ranks).
  void forward(float* out, float* lse, const float* qkv, int ld, int B, int NH, int NKV, int hs,
               const DocumentRows& rows, const CpSplit& split);
  // Overwrites dqkv [B, Tl, ld] with the gradient through attention of dout (out, lse: the
  // forward's).
  void backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int ld,
                int B, int NH, int NKV, int hs, const DocumentRows& rows, const CpSplit& split);
  // The sequence length the split is of (a curriculum's step changes it).
  void set_sequence(int T) { T_ = T; }
  int size() const { return cp_.size(); }
  int rank() const { return cp_.rank(); }

 private:
  int next() const { return (cp_.rank() + 1) % cp_.size(); }
  int prev() const { return (cp_.rank() + cp_.size() - 1) % cp_.size(); }
  void ensure(size_t kv, size_t out, size_t lse);
  // Each local row's visible keys among block owner's: [lo, hi) in the block's rows.
  void ranges_for(int owner, const DocumentRows& rows, const CpSplit& split, int B, int Tl);
  comm::Group& cp_;
  int T_ = 0;
  // [B, Tl, 2 CK] k then v per row: the block in hand and the one arriving; two dK/dV sums
  // (one received into while the other is sent) and this rank's share of the current one.
  Buffer<float> block_, next_block_, dblock_, next_dblock_, dpart_;
  Buffer<float> part_out_, part_lse_;
  std::vector<int> lo_, hi_;
};

// All-gather attention (--cp-comm all-gather; Llama 3's, Dubey et al. 2024 §3.3.2): every
// rank gathers the whole sequences' k and v, laid out in sequence order, and attends with
// its own rows over the keys each may see in one ranged call (a document mask needs
// nothing more). The backward gathers them again rather than keeping them, and
// reduce-scatters the keys' gradients back to the ranks that hold those rows. Simpler than
// the ring and nothing to overlap: the gathers are exposed, and cheap where key/value heads
// are few (grouped-query attention).
class GatherAttention {
 public:
  explicit GatherAttention(comm::Group& cp) : cp_(cp) {}
  void set_sequence(int T) { T_ = T; }
  // As RingAttention's.
  void forward(float* out, float* lse, const float* qkv, int ld, int B, int NH, int NKV, int hs,
               const DocumentRows& rows, const CpSplit& split);
  void backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int ld,
                int B, int NH, int NKV, int hs, const DocumentRows& rows, const CpSplit& split);

 private:
  // Every rank's k and v rows into whole_ [B, T, 2 CK], each row at its sequence index.
  void gather(const float* qkv, int ld, int B, int C, int CK, const CpSplit& split);
  kernels::AttentionBlock block(const float* qkv, int ld, int B, int NH, int NKV, int hs,
                                const DocumentRows& rows) const;
  comm::Group& cp_;
  int T_ = 0;
  Buffer<float> mine_, ranks_, whole_;  // [B Tl, 2CK], [cp, B Tl, 2CK] by rank, [B, T, 2CK]
  Buffer<float> dwhole_;                // [B, T, 2CK]: the keys' gradients, backward
};

// DeepSpeed-Ulysses over the cp group (--cp-comm a2a): an all-to-all trades sequence for
// heads, so that each rank attends with NH/cp query heads (and their key/value heads: NKV/cp,
// or one replicated when NKV < cp) over the whole sequence, and a second trades back. The
// causal kernel runs as on one rank (at bf16 too); under a document mask the ranged one.
// Backward trades the stored qkv and output again rather than keeping the traded copies.
//
// Hybrid (--cp-comm hybrid; Megatron-Core's a2a+p2p, USP): the all-to-all runs inside a
// group of cp_a2a consecutive cp ranks, and the ring `across` the cp/cp_a2a groups. The cp
// split makes the group's rows the rows one rank of a cp/cp_a2a split holds (two chunks of
// T cp_a2a/(2 cp)), and each member's two chunks sit in them as a cp_a2a split of those
// would place them; so the trade lays the group's rows out in sequence order, and the ring
// runs on them with the group's heads as it runs on one rank's rows.
class UlyssesAttention {
 public:
  explicit UlyssesAttention(comm::Group& cp, std::unique_ptr<RingAttention> across = nullptr)
      : cp_(cp), across_(std::move(across)) {}
  // T: the whole sequence; the trade's rows are T / (the ring's groups) of it.
  void set_sequence(int T) {
    T_ = across_ ? T / across_->size() : T;
    if (across_) across_->set_sequence(T);
  }
  // The rows the traded heads attend with, in the trade's order: the whole sequences' under
  // a document mask (`whole`), else none (causal: the kernel's own); hybrid: always its
  // group's rows (the ring's key ranges).
  DocumentRows traded_rows(const DocumentRows* whole, int B, int T) const;
  // Hybrid: the split whose rows the group holds (the causal one over the ring's groups).
  CpSplit across_split() const { return {across_->size(), across_->rank()}; }
  // As RingAttention's, with lse [B, NH/cp, T] (the traded heads' whole rows, the same size);
  // `whole`: traded_rows, or null when those are none.
  void forward(float* out, float* lse, const float* qkv, int ld, int B, int NH, int NKV, int hs,
               const DocumentRows* whole, kernels::Precision p);
  void backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int ld,
                int B, int NH, int NKV, int hs, const DocumentRows* whole, kernels::Precision p);

  // A local row's columns that rank j attends with, in the order j lays them out.
  struct Segment {
    int offset, width;
  };
  using Segments = std::vector<Segment>;

 private:
  struct Heads {
    int q0, nq, kv0, nkv;  // rank j's query heads [q0, q0+nq) and key/value heads [kv0, kv0+nkv)
  };
  Heads heads_of(int j, int NH, int NKV) const;
  Segments qkv_columns(int j, int NH, int NKV, int hs) const;
  Segments out_columns(int j, int NH, int NKV, int hs) const;
  // What one call trades: every rank's columns, this rank's heads and widths (W of q, k, v;
  // Cq of the output); sizes the buffers for it (dqkv_ and dout_ with `backward`).
  struct Trade {
    std::vector<Segments> qkv_cols, out_cols;
    Heads me;
    int W, Cq, hs;
  };
  Trade prepare(int B, int NH, int NKV, int hs, bool backward);
  // The traded whole sequences' attention operands (q, k, v in qkv_), each row seeing its
  // document's keys.
  kernels::AttentionBlock ranged(const Trade& t, int B, const DocumentRows& whole) const;
  // Local rows [B, Tl, ld] -> this rank's columns of every row of the whole sequences [B, T, W].
  void to_whole(const float* local, int ld, int B, const std::vector<Segments>& cols, float* whole);
  // The reverse: this rank's [B, T, W] back to every rank's rows, written (or added) into
  // each local row's columns of the sending rank.
  void to_local(const float* whole, int B, const std::vector<Segments>& cols, float* local, int ld, bool add);
  comm::Group& cp_;
  std::unique_ptr<RingAttention> across_;  // hybrid: the ring across the all-to-all groups
  int T_ = 0;
  Buffer<float> send_, recv_, qkv_, out_, dout_, dqkv_;
};

}  // namespace meshtrain::model
