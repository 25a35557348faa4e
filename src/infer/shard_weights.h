// The weights one rank of a tensor- and pipeline-parallel decoding group holds: only what it
// reads (weights_read), about 1/(tp x pp) of the model, packed in one buffer. A model that
// does not fit one rank's memory is served by ranks that each hold their share, as
// Megatron's and DeepSpeed-Inference's ranks load only their checkpoint shards.
//
// Filled from the whole model's flat parameters in pieces (write: a checkpoint streamed, or
// a model in memory), keeping the held ranges of each piece. Reading anything it does not
// hold fails with a message naming the tensor: the decoder and weights_read must agree.
#pragma once
#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "core/status.h"
#include "infer/decoder.h"
#include "model/param_store.h"

namespace meshtrain::infer {

class ShardWeights : public model::ParamStore {
 public:
  // `held`: sorted, disjoint ranges of `layout`'s flat parameters (which must outlive the store).
  ShardWeights(const model::ParamLayout& layout, std::vector<FlatRange> held);

  // Setup: elements [at, at + n) of the whole model's flat parameters; the held ones are kept.
  Status write(size_t at, size_t n, const float* values);

  const float* acquire_params(int u) override;
  float* acquire_grads(int u) override;  // inference only: fails
  const float* fp32_tensor(const float* unit, int u, const model::ParamTensor& t,
                           const model::ParamLayout& layout) const override;
  const float* fp32_rows(const float* unit, int u, const model::ParamTensor& t, int64_t first_row, int64_t rows,
                         const model::ParamLayout& layout) const override;

  // The elements held, and the whole model's.
  int64_t held() const { return (int64_t)values_.size(); }
  int64_t whole() const { return (int64_t)layout_.total(); }

 private:
  // Flat elements [begin, begin + count), which must lie in one held range, in values_.
  const float* find(size_t begin, size_t count, const model::ParamTensor& t) const;

  const model::ParamLayout& layout_;
  std::vector<FlatRange> held_;
  std::vector<size_t> at_;  // per held range: its offset in values_
  Buffer<float> values_;
};

}  // namespace meshtrain::infer
