// Where every parameter tensor lives inside the one flat parameter buffer. Gradients and
// optimizer moments use the same layout, so a ZeRO shard or a reduction bucket is an
// offset range. Tensors are stored layer by layer: a layer (or a pipeline stage) is one
// contiguous range.
#pragma once
#include <array>
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
  // dim 0 = key/value heads (k_proj, v_proj and their biases): split by heads over tp, or,
  // with fewer heads than ranks, rank r holds head r / (t / heads), each head on t / heads
  // ranks whose weight gradients Gpt sums (Megatron's replication).
  kKvHeadRows,
};

// Where an MoE layer's routed experts sit on the tensor-parallel group (Megatron's expert
// tensor parallelism, 1 or tp): split like the dense MLP (kSplit, expert-tp = tp: each tp
// rank computes its slice of every expert on every dispatched row), or whole on every tp
// rank (kReplicated, expert-tp = 1: each computes the whole experts on its share of the
// rows, and the copies' gradients are summed over tp). docs/moe.md.
enum class ExpertTp { kSplit, kReplicated };

struct ParamTensor {
  // Hugging Face's name: GPT-2's (e.g. "h.3.attn.c_attn.weight") or Llama's (e.g.
  // "model.layers.3.self_attn.q_proj.weight").
  std::string name;
  std::vector<int64_t> shape;  // this rank's shape, engine layout: linear weights are [out, in]
  std::vector<int64_t> global_shape;  // the whole tensor (equal to shape when tp = 1)
  TpSplit split = TpSplit::kReplicated;
  size_t offset = 0;           // in elements from the buffer start
  size_t numel = 0;
  bool decay = false;          // AdamW weight decay applies (2-D tensors only)
  bool hf_transposed = false;  // HF's Conv1D stores this weight as [in, out]
  // A linear layer's weight or the tied embedding wte: read only as a GEMM operand (and, for
  // wte, row by row by the embedding lookup), so a bf16 copy can serve every use.
  bool gemm_weight = false;
  // A linear layer's weight: its gradient is one GEMM's product per micro-batch, which the
  // GEMM can add into a 16-bit gradient itself (wte's also takes the embedding's rows).
  bool gemm_grad = false;
  int kv_heads = 0;            // kKvHeadRows: the key/value heads of dim 0
  // Another tp rank holds the same elements and counts them (in the gradient norm):
  // replicated tensors on tp ranks > 0, a replicated key/value head on all but its first rank.
  bool tp_copy = false;
  int layer = -1;              // block index, -1 for embeddings and the final norm
  int expert = -1;             // an MoE layer's routed expert (its index among all experts), else -1
  int unit = -1;               // the local unit holding it (ParamLayout::units())
  // wte or an untied head: padded vocabulary rows (zero, no gradient, unpadded in HF files).
  bool vocabulary_rows() const { return layer < 0 && split == TpSplit::kRows; }
};

// The roles of one block's tensors (GPT-2's field order inside the layout). An architecture
// without a part has no tensor in its slot (no biases, no norm bias: ParamLayout::has).
// Llama's q, k and v projections are three tensors laid out back to back, so kQkvW (q_proj)
// starts the fused [q; k; v] weight the model multiplies by, and its gate and up projections
// likewise make kFcW (gate_proj) the fused [gate; up] weight.
// An MoE layer (GptConfig::is_moe_layer) has no kFc* tensors: its MLP is the router kRouterW,
// the shared experts as one MLP ([gate; up] kSharedFcW, down kSharedProjW) when it has
// them, and the routed experts (ParamLayout::expert_fc / expert_proj), each one contiguous
// range [w1; w3; w2] (Mixtral's names: w1 gate, w3 up, w2 down), expert after expert.
enum LayerTensor : int {
  kLn1W, kLn1B, kQkvW, kQkvB, kAttProjW, kAttProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB,
  kRouterW, kSharedFcW, kSharedProjW,
  kNumLayerTensors
};

// A unit is the granularity of parameter ownership: the embeddings (wte, wpe), each block,
// and the final norm (with an untied head), each a contiguous range of the flat buffer. ZeRO shards, gathers
// and reduces unit by unit; backward finishes them in reverse order.
// An MoE layer's routed experts are units of their own, one per expert, after their
// block's unit: they are what expert parallelism splits (a rank holds its experts' units
// only) and what reduces over the expert-data-parallel group.
struct ParamUnit {
  size_t offset = 0;
  size_t numel = 0;
  // The unit's position in the whole model's units: 0 embeddings, then each block followed
  // by its experts (an MoE layer's), then the final norm: block_unit_id, moe_unit_id,
  // final_unit_id (for a dense model 1 + l and L + 1).
  int id = 0;
  int expert = -1;  // a routed expert's unit: its expert index; else -1
};

// The layers one rank holds: the pipeline stages ("chunks") it runs, in chunk order, each
// a contiguous range of layers (interleaved schedules give a rank several). A chunk that
// starts at layer 0 also runs the embedding; one that ends at layer L runs the final norm,
// the head and the loss: a tied head's weight is wte, so that chunk holds the embedding unit
// too; an untied head lives in the final norm's unit. No chunks means the whole model.
struct ModelPart {
  struct Chunk {
    int begin = 0, end = 0;  // layers [begin, end)
  };
  std::vector<Chunk> chunks;
};

class ParamLayout {
 public:
  // The layout of tensor-parallel rank `tp_rank` of `tp` (tp = 1: the whole model) for the
  // layers of `part` (empty: all of them). Tensors keep their whole-model names and
  // layer indices; offsets are compact over what the part holds.
  // With expert parallelism over `ep` ranks, rank `ep_rank` holds E/ep of each MoE layer's
  // routed experts (is_whole_model() is then false).
  // `expert_tp`: how the routed experts sit on the tp group (ExpertTp).
  explicit ParamLayout(const GptConfig& config, int tp = 1, int tp_rank = 0,
                       const ModelPart& part = {}, int ep = 1, int ep_rank = 0,
                       ExpertTp expert_tp = ExpertTp::kSplit);
  int tp() const { return tp_; }
  // The routed experts are whole on every tp rank (ExpertTp::kReplicated with tp > 1).
  bool experts_replicated() const { return expert_tp_ == ExpertTp::kReplicated && tp_ > 1; }
  ExpertTp expert_tp() const { return expert_tp_; }
  int tp_rank() const { return tp_rank_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  size_t total() const { return total_; }
  const ParamTensor* find(const std::string& name) const;

  // The tensors of a held unit (the accessors check that it is held and has the part).
  const ParamTensor& wte() const { return slot(embedding_unit(), 0); }
  const ParamTensor& wpe() const { return slot(embedding_unit(), 1); }
  const ParamTensor& layer(int l, LayerTensor t) const { return slot(block_unit(l), t); }
  const ParamTensor& lnf_w() const { return slot(final_unit(), 0); }
  const ParamTensor& lnf_b() const { return slot(final_unit(), 1); }
  // An untied head's weight (in the final norm's unit, on the last stage).
  const ParamTensor& head() const { return slot(final_unit(), 2); }
  // Whether the architecture has the part: learned positions, a block's tensor t (biases,
  // a LayerNorm's bias), the final norm's bias, an untied head.
  bool has_wpe() const { return has_slot(embedding_unit(), 1); }
  bool has(int l, LayerTensor t) const { return has_slot(block_unit(l), t); }
  // An MoE layer's routed experts held here, by local index j (expert first_expert() + j:
  // experts [ep_rank E/ep, (ep_rank + 1) E/ep)): their unit, the first projection ([w1; w3]
  // for SwiGLU, w1 for GELU) and the down projection w2.
  int local_experts(int l) const { return (int)unit_experts_[block_unit(l)].size(); }
  int first_expert() const { return first_expert_; }
  int ep() const { return ep_; }
  int ep_rank() const { return ep_rank_; }
  int expert_unit(int l, int j) const { return tensors_[unit_experts_[block_unit(l)][j][0]].unit; }
  const ParamTensor& expert_fc(int l, int j) const { return tensors_[unit_experts_[block_unit(l)][j][0]]; }
  const ParamTensor& expert_proj(int l, int j) const { return tensors_[unit_experts_[block_unit(l)][j][1]]; }
  bool has_lnf_b() const { return has_slot(final_unit(), 1); }
  bool has_untied_head() const { return untied_head_; }

  // Held units in whole-model order: embeddings, blocks by layer, final norm. Local unit
  // indices below are positions in units(); for a dense whole model, 0 = embeddings, 1 + l =
  // block l, num_units() - 1 = final norm.
  const std::vector<ParamUnit>& units() const { return units_; }
  int num_units() const { return (int)units_.size(); }
  bool has_embedding() const { return embedding_unit_ >= 0; }
  bool has_final_norm() const { return final_unit_ >= 0; }
  bool has_layer(int l) const { return l >= 0 && l < (int)block_unit_.size() && block_unit_[l] >= 0; }
  int embedding_unit() const;
  int block_unit(int layer) const;
  int final_unit() const;
  // Local index of the unit with whole-model index `id`, or -1 when not held.
  int local_unit(int id) const;
  bool is_whole_model() const { return whole_ && ep_ == 1; }
  // Every layer, the embeddings and the final norm (a whole pipeline; experts may be split).
  bool holds_every_layer() const { return whole_; }
  // Offset of tensor t inside its unit.
  size_t offset_in_unit(const ParamTensor& t) const;
  int unit_of(const ParamTensor& t) const;

 private:
  // Adds a tensor in `slot` of the unit being built (-1: none, a fused weight's later part).
  // linear: a linear layer's weight, read only by GEMMs (gemm_weight, gemm_grad).
  void add(std::string name, std::vector<int64_t> global_shape, TpSplit split, bool decay,
           bool hf_transposed, int layer, int slot, bool linear, int kv_heads = 0);
  void close_unit(int id, size_t first_tensor);
  void add_gpt2_block(const GptConfig& c, int l);
  void add_llama_block(const GptConfig& c, int l);
  void add_moe_mlp(const GptConfig& c, int l, const std::string& prefix);
  void add_expert_units(const GptConfig& c, int l);
  const ParamTensor& slot(int unit, int k) const;
  bool has_slot(int unit, int k) const { return unit_slots_[unit][k] >= 0; }
  static constexpr int kSlots = kNumLayerTensors;
  std::vector<std::array<int, kSlots>> unit_slots_;  // per local unit: slot -> tensor or -1
  std::array<int, kSlots> building_{};                // the unit being built's slots
  // Per local unit: a block's routed experts' (first projection, down projection) tensors.
  std::vector<std::vector<std::array<int, 2>>> unit_experts_;
  bool untied_head_ = false;
  int tp_ = 1, tp_rank_ = 0, ep_ = 1, ep_rank_ = 0, first_expert_ = 0;
  ExpertTp expert_tp_ = ExpertTp::kSplit;
  bool whole_ = true;
  std::vector<ParamTensor> tensors_;
  std::vector<ParamUnit> units_;
  std::vector<int> block_unit_;            // per layer: local unit or -1
  int embedding_unit_ = -1, final_unit_ = -1;
  size_t total_ = 0;
};

// Whole-model unit ids (ParamUnit::id): block l's, expert e's of MoE layer l (right after
// its block), the final norm's.
int block_unit_id(const GptConfig& c, int l);
int moe_unit_id(const GptConfig& c, int l, int e);
int final_unit_id(const GptConfig& c);
// A unit's name for reports: "embeddings", "block 3", "block 0 expert 5", "final norm".
std::string unit_name(const GptConfig& c, int id);

// Copies between a whole tensor (global layout) and tensor-parallel rank r's part of it.
void global_to_local(const ParamTensor& t, int tp, int tp_rank, const float* global, float* local);
void local_to_global(const ParamTensor& t, int tp, int tp_rank, const float* local, float* global);

}  // namespace meshtrain::model
