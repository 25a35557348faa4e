// Where every parameter tensor lives inside the one flat parameter buffer. Gradients and
// optimizer moments use the same layout, so a ZeRO shard or a reduction bucket is an
// offset range. Tensors are stored layer by layer: a layer (or a pipeline stage) is one
// contiguous range.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace meshtrain::model {

struct ParamTensor {
  std::string name;            // Hugging Face GPT-2 name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // engine layout: linear weights are [out, in]
  size_t offset = 0;           // in elements from the buffer start
  size_t numel = 0;
  bool decay = false;          // AdamW weight decay applies (2-D tensors only)
  bool hf_transposed = false;  // HF's Conv1D stores this weight as [in, out]
  int layer = -1;              // block index, -1 for embeddings and the final norm
};

// Field order of one block's tensors inside the layout.
enum LayerTensor : int {
  kLn1W, kLn1B, kQkvW, kQkvB, kAttProjW, kAttProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB,
  kNumLayerTensors
};

// A unit is the granularity of parameter ownership: the embeddings (wte, wpe), each block,
// and the final norm, each a contiguous range of the flat buffer. ZeRO shards, gathers
// and reduces unit by unit; backward finishes them in reverse order.
struct ParamUnit {
  size_t offset = 0;
  size_t numel = 0;
};

class ParamLayout {
 public:
  explicit ParamLayout(const GptConfig& config);
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  size_t total() const { return total_; }
  const ParamTensor* find(const std::string& name) const;

  const ParamTensor& wte() const { return tensors_[0]; }
  const ParamTensor& wpe() const { return tensors_[1]; }
  const ParamTensor& layer(int l, LayerTensor t) const {
    return tensors_[2 + (size_t)l * kNumLayerTensors + t];
  }
  const ParamTensor& lnf_w() const { return tensors_[tensors_.size() - 2]; }
  const ParamTensor& lnf_b() const { return tensors_[tensors_.size() - 1]; }

  // Units: 0 = embeddings, 1 + l = block l, num_units() - 1 = final norm.
  const std::vector<ParamUnit>& units() const { return units_; }
  int num_units() const { return (int)units_.size(); }
  static constexpr int kEmbeddingUnit = 0;
  static int block_unit(int layer) { return 1 + layer; }
  int final_unit() const { return num_units() - 1; }
  // Offset of tensor t inside its unit.
  size_t offset_in_unit(const ParamTensor& t) const;
  int unit_of(const ParamTensor& t) const;

 private:
  void add(std::string name, std::vector<int64_t> shape, bool decay, bool hf_transposed, int layer);
  std::vector<ParamTensor> tensors_;
  std::vector<ParamUnit> units_;
  size_t total_ = 0;
};

}  // namespace meshtrain::model
