// 1-bit Adam's compressed phase in the engine (Tang et al. 2021; docs/compression.md): the
// momentum exchange that replaces the gradient reduction once the variance is frozen.
//
// With v frozen, Adam's denominator d = sqrt(v / (1 - β2^K)) + eps is a constant, the same
// on every rank, and the update is lr' · m / d. What the ranks exchange is the momentum
// already divided by it, u = m / d (the paper exchanges m; the mean is the same, since d is
// common, but the signs' error is not): each rank forms
//   u_i = β1 u + (1 - β1) N g_i / d      (g_i: this rank's part of the summed gradient, so
//                                         the mean over ranks of N g_i is the gradient)
// and the ranks average the u_i through compress::OneBitAllReduce (signs and one scale per
// block, error feedback on both sides). A sign carries its block's RMS: exchanging m, an
// element whose momentum and variance are both small (an embedding row seen a few times)
// receives the block's RMS over its own small d, an update hundreds of times too large,
// which on the Brown corpus spiked the loss from 10.5 to 17; exchanging u, every element's
// error is relative to its own update (docs/compression.md has the runs).
//
// Chunk j of the exchanged buffer is rank j's ZeRO shard: the buffer is the flat layout
// permuted into ShardLayout's per-unit shards (rank j's shards of every unit, then rank
// j+1's), so at ZeRO-1 the server side of rank j produces exactly the momentum of the
// optimizer shard it owns, and at ZeRO-0 every rank unpacks all of it. The optimizer's m
// holds u in this phase (AdamW::Rule::preconditioned); the next step takes the whole
// averaged u from the all-gather's 1-bit blocks, decompressed into the exchange buffer:
// they are u exactly, the same values as the ranks' m shards, so a resume that gathers
// those is bit for bit.
// Elements whose v is zero at the freeze (padded vocabulary rows, tokens the plain steps
// never saw) are masked out, as DeepSpeed's exp_avg_mask does by hand.
#pragma once
#include <cstdint>

#include "comm/group.h"
#include "compress/onebit.h"
#include "core/memory.h"
#include "model/param_layout.h"
#include "parallel/shard_layout.h"

namespace meshtrain::parallel {

class OneBitAdam {
 public:
  // One scale per `scale_block` elements of a chunk (a multiple of 8; 0: one per chunk).
  // `bound`: the largest |u| an element may carry (update_bound(); infinity: none).
  OneBitAdam(comm::Group& group, const model::ParamLayout& layout, float beta1, size_t scale_block, float bound);

  // The largest |m / sqrt(v)| Adam itself can reach with these betas, (1 - β1) / sqrt(1 - β2)
  // / (1 - β1 / sqrt(β2)) when β1 < sqrt(β2) (Kingma and Ba 2015, Section 2.1: Adam's step is
  // bounded): 5.8 at β1 = 0.9, β2 = 0.95. With v frozen, an element that had almost no
  // gradient before the freeze has an almost zero d, and a later gradient would make u = g / d
  // without limit (a rare token's embedding row, then its whole scale block through the
  // block's RMS: the loss went from 7.7 to 15 on Brown). Clamping u there keeps every update
  // within what Adam could have made. Infinity where the betas give no bound.
  static float update_bound(float beta1, float beta2);

  // Before the first exchange (at the freeze, or after a resume): the optimizer's m and v,
  // `full` over the flat layout (ZeRO-0) or this rank's shard (ZeRO-1; what the worker side
  // needs of the other shards is gathered over the group once, in fp32), the frozen
  // denominator's bias correction sqrt(1 - β2^K) and eps. `m_is_u`: m already holds u (a
  // resume inside the compressed phase); else it is Adam's m, divided by d here. An element
  // whose v is zero never had a gradient and is masked: a sign cannot say zero.
  void start_from(const float* m, const float* v, bool full, float bias2_sqrt, float eps, bool m_is_u);
  bool started() const { return started_; }
  // grads: this rank's gradient (flat layout), multiplied by grad_scale (clipping) on the
  // way; m: set to the averaged u (whole, or this rank's shard).
  void exchange(const float* grads, float grad_scale, float* m, bool full);
  // Elements masked out (zero variance at the freeze), over the whole permuted buffer.
  size_t masked() const { return masked_; }

  // Bytes one exchange sends from this rank (the comm layer's count).
  int64_t wire_bytes() const {
    return compress::OneBitAllReduce::wire_bytes(group_.size(), chunk_, allreduce_.scale_block());
  }
  size_t chunk() const { return chunk_; }
  size_t scale_block() const { return allreduce_.scale_block(); }
  // Per-rank state for checkpoints: the worker error (N chunks) and the server error (one).
  Buffer<float>& worker_error() { return worker_error_; }
  Buffer<float>& server_error() { return server_error_; }

 private:
  // Calls f(global offset, count, buffer offset) for every run of real elements of the
  // permuted buffer (rank j's shard of unit u at j * chunk + its local offset).
  template <typename F>
  void for_each_piece(F f) const;
  void apply_mask(float* x) const;  // masked elements (and padding) to zero

  comm::Group& group_;
  ShardLayout perm_;
  size_t chunk_;
  float beta1_, bound_;
  Buffer<float> worker_error_, server_error_;
  Buffer<float> start_;  // start_from's u until the next exchange (then the blocks)
  Buffer<float> work_;   // each exchange's u, N chunks (kept: allocating it per step is slow)
  Buffer<float> inv_den_;  // 1 / d, per element of the permuted buffer (0 where masked)
  Buffer<uint8_t> live_;   // 1 where v > 0 at the freeze
  size_t masked_ = 0;
  compress::OneBitAllReduce allreduce_;
  bool started_ = false;
};

}  // namespace meshtrain::parallel
