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

// How a tensor is split over the tensor-parallel group (Megatron-LM's scheme).
enum class TpSplit {
  kReplicated,  // every tp rank holds all of it (LayerNorms, wpe, row-parallel biases)
  kRows,        // dim 0 split in t contiguous parts (column-parallel weights, their biases, wte)
  kQkvRows,     // dim 0 = [q; k; v], each split by heads: rank r holds its heads of all three
  kCols,        // dim 1 split in t contiguous parts (row-parallel weights)
};

struct ParamTensor {
  std::string name;            // Hugging Face GPT-2 name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // this rank's shape, engine layout: linear weights are [out, in]
  std::vector<int64_t> global_shape;  // the whole tensor (equal to shape when tp = 1)
  TpSplit split = TpSplit::kReplicated;
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
  // The layout of tensor-parallel rank `tp_rank` of `tp` (tp = 1: the whole model).
  explicit ParamLayout(const GptConfig& config, int tp = 1, int tp_rank = 0);
  int tp() const { return tp_; }
  int tp_rank() const { return tp_rank_; }
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
  void add(std::string name, std::vector<int64_t> global_shape, TpSplit split, bool decay,
           bool hf_transposed, int layer);
  int tp_ = 1, tp_rank_ = 0;
  std::vector<ParamTensor> tensors_;
  std::vector<ParamUnit> units_;
  size_t total_ = 0;
};

// Copies between a whole tensor (global layout) and tensor-parallel rank r's part of it.
void global_to_local(const ParamTensor& t, int tp, int tp_rank, const float* global, float* local);
void local_to_global(const ParamTensor& t, int tp, int tp_rank, const float* local, float* global);

}  // namespace meshtrain::model
