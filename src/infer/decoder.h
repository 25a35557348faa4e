// Autoregressive inference with a KV cache: each appended token costs O(T) attention work
// instead of re-running the whole sequence.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/memory.h"
#include "model/gpt.h"

namespace meshtrain::infer {

class KvCacheDecoder {
 public:
  explicit KvCacheDecoder(const model::Gpt& gpt);

  // Runs tokens at positions position()..position()+n-1 through the model, filling the
  // cache; returns the logits [V] of the last one (valid until the next call).
  // The caller keeps position() + n <= max_seq_len.
  const float* append(std::span<const int> tokens);
  int position() const { return pos_; }
  int capacity() const { return gpt_.config().max_seq_len; }
  void reset() { pos_ = 0; }

 private:
  void embed(std::span<const int> tokens, float* x) const;
  void norm(float* out, const float* x, const float* weight, const float* bias, int n) const;
  void block(int l, float* x, int n);
  void moe_mlp(int l, const float* ln, int n, float* out) const;

  const model::Gpt& gpt_;
  int pos_ = 0;
  Buffer<float> k_cache_, v_cache_;  // [L, maxT, kv_heads x hs] each
  Buffer<float> logits_;             // [V]
};

}  // namespace meshtrain::infer
