// Autoregressive inference with a KV cache: each appended token costs O(T) attention work
// instead of re-running the whole sequence.
//
// BatchDecoder holds several sequences, each with its own cache and position. A step takes
// new tokens for any of them (a prompt's prefill, or one sampled token) and runs all those
// rows through the blocks together: the GEMMs see every row, and each row attends only to
// its own sequence's cache. No row is padding. Sequences join and leave between steps, which
// is what continuous batching needs. KvCacheDecoder is the one-sequence case.
//
// A row's results do not depend on the rows beside it, bit for bit: the linear layers use
// matmul_forward_rowwise (one summation order whatever the rows), and every other operator
// works row by row or element by element. So a sequence decoded in any batch gets exactly
// the logits, and with the same seed the same text, that it gets alone.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/group.h"
#include "core/memory.h"
#include "model/gpt.h"

namespace meshtrain::infer {

// How a model group's ranks split decoding (null groups: one rank). Every rank of the group
// calls step() with the same batch, and every rank gets every sequence's logits, so that
// they all sample the same tokens.
//   tp: every linear layer's output rows are split into contiguous shares, computed with
//       the whole input and all-gathered (not Megatron's row-parallel partial sums, whose
//       all-reduce would add in another order than one rank); attention is split by KV
//       heads, each rank caching only its own. Every output element is computed as on one
//       rank, so the text is the same. MoE layers' MLPs run whole on every tp rank.
//   pp: the layers are split into consecutive stages; a stage receives the step's rows from
//       the one before and sends them on, and the last broadcasts the logits.
//   micro_batches: with pp, a step's sequences split into this many groups that follow each
//       other through the stages (at most one per sequence).
struct DecodeGroups {
  comm::Group* tp = nullptr;
  comm::Group* pp = nullptr;
  int micro_batches = 1;
  int tp_size() const { return tp ? tp->size() : 1; }
  int tp_rank() const { return tp ? tp->rank() : 0; }
  int stages() const { return pp ? pp->size() : 1; }
  int stage() const { return pp ? pp->rank() : 0; }
};

// Rows [first, first + count) (count 0: none).
struct RowRange {
  int64_t first = 0, count = 0;
};
// Tensor-parallel rank `rank`'s share of `rows` output rows: contiguous, ceil(rows / tp) long
// (the last shares shorter, or empty).
RowRange tp_share(int64_t rows, int tp, int rank);
// Elements [begin, begin + count) of the whole model's flat parameters.
struct FlatRange {
  size_t begin = 0, count = 0;
};
// The parameters the rank at `at`'s place reads when decoding, in layout order: its stage's
// layers, of their linear layers its tp share of the output rows (the rest whole), and its
// share of the vocabulary's rows of the embedding (the first stage's lookup, the last
// stage's tied head) and of an untied head. What a rank needs to hold (infer::ShardWeights):
// about 1/(tp x pp) of the model.
std::vector<FlatRange> weights_read(const model::Gpt& gpt, const DecodeGroups& at);

class BatchDecoder {
 public:
  explicit BatchDecoder(const model::Gpt& gpt, DecodeGroups groups = {});

  // A new, empty sequence (its cache allocated): its id.
  int add();
  // Frees sequence `id`'s cache; the id is not reused.
  void remove(int id);
  int position(int id) const { return seq(id).pos; }
  int capacity() const { return gpt_.config().max_seq_len; }
  void reset(int id) { seq(id).pos = 0; }

  struct Rows {
    int id = 0;
    std::span<const int> tokens;  // at positions position(id)...; position + n <= capacity
  };
  // Appends every entry's tokens to its sequence (each sequence at most once per step).
  void step(std::span<const Rows> batch);
  // The logits [V] of sequence id's last appended token (valid until its next step).
  const float* logits(int id) const { return seq(id).logits.data(); }

 private:
  struct Sequence {
    int pos = 0;
    Buffer<float> k_cache, v_cache;  // [this stage's layers, maxT, this rank's kv heads x hs] each
    Buffer<float> logits;            // [V]
  };
  class HeldUnit;  // a unit's parameters from the model's store while in scope
  // Where one sequence's rows sit in a micro-batch's rows, and its new tokens.
  struct Segment {
    Sequence* seq;
    int row, n;
    std::span<const int> tokens;
  };
  Sequence& seq(int id) const;
  void embed(const std::vector<Segment>& segments, float* x) const;
  // One micro-batch's pass through this stage's layers (received from the stage before, or
  // embedded), on to the next stage or through the head.
  void run_stage(const std::vector<Segment>& segments, int rows);
  void norm(float* out, const float* x, const float* weight, const float* bias, int n) const;
  void block(int l, float* x, const std::vector<Segment>& segments, int rows);
  void moe_mlp(int l, const HeldUnit& block, const float* ln, int n, float* out) const;
  // out[n, OC] = in[n, K] @ W[OC, K]^T + b (b may be null): this rank's share of W's rows,
  // all-gathered.
  void linear(float* out, const float* in, const HeldUnit& unit, const model::ParamTensor& W,
              const model::ParamTensor* b, int n, int K, int OC);
  // Rows of `share` columns from each tp rank, [tp][n][share], into out[n][cols] side by side.
  void gather_columns(float* out, const float* mine, int n, int share, int cols);
  void head(const std::vector<Segment>& segments, const float* x);

  const model::Gpt& gpt_;
  DecodeGroups groups_;
  int tp_ = 1, tp_rank_ = 0;
  int first_layer_ = 0, last_layer_ = 0;  // this stage's layers [first, last)
  int kv_heads_ = 0;                      // this rank's KV heads
  std::vector<std::unique_ptr<Sequence>> sequences_;  // by id; null once removed
};

// One sequence.
class KvCacheDecoder {
 public:
  explicit KvCacheDecoder(const model::Gpt& gpt, DecodeGroups groups = {}) : batch_(gpt, groups), id_(batch_.add()) {}

  // Runs tokens at positions position()..position()+n-1 through the model, filling the
  // cache; returns the logits [V] of the last one (valid until the next call).
  // The caller keeps position() + n <= max_seq_len.
  const float* append(std::span<const int> tokens) {
    const BatchDecoder::Rows rows{id_, tokens};
    batch_.step(std::span<const BatchDecoder::Rows>(&rows, 1));
    return batch_.logits(id_);
  }
  int position() const { return batch_.position(id_); }
  int capacity() const { return batch_.capacity(); }
  void reset() { batch_.reset(id_); }

 private:
  BatchDecoder batch_;
  int id_;
};

}  // namespace meshtrain::infer
