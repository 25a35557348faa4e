#include "model/param_layout.h"

#include <algorithm>

#include "core/check.h"

namespace meshtrain::model {

ParamLayout::ParamLayout(const GptConfig& c, int tp, int tp_rank, const ModelPart& part, int ep, int ep_rank,
                         ExpertTp expert_tp)
    : untied_head_(!c.tied_head), tp_(tp), tp_rank_(tp_rank), ep_(ep), ep_rank_(ep_rank), expert_tp_(expert_tp) {
  CHECK_MSG(ep >= 1 && 0 <= ep_rank && ep_rank < ep && (ep == 1 || c.moe.experts % ep == 0),
            "expert parallelism must divide the experts");
  first_expert_ = c.is_moe() ? ep_rank * (c.moe.experts / ep) : 0;
  using S = TpSplit;
  building_.fill(-1);
  const int64_t C = c.dim;
  const int L = c.layers;
  const bool gpt2_names = c.is_gpt2();
  std::vector<bool> held(L, part.chunks.empty());
  bool embedding = part.chunks.empty(), final_norm = part.chunks.empty();
  for (const auto& ch : part.chunks) {
    CHECK_MSG(0 <= ch.begin && ch.begin < ch.end && ch.end <= L, "invalid pipeline chunk");
    for (int l = ch.begin; l < ch.end; l++) held[l] = true;
    embedding = embedding || ch.begin == 0 || (ch.end == L && c.tied_head);  // a tied head is wte
    final_norm = final_norm || ch.end == L;
  }
  whole_ = embedding && final_norm && std::find(held.begin(), held.end(), false) == held.end();
  block_unit_.assign(L, -1);
  if (embedding) {
    const size_t first = tensors_.size();
    add(gpt2_names ? "wte.weight" : "model.embed_tokens.weight", {c.padded_vocab(), C}, S::kRows, true, false,
        -1, 0, false);
    if (c.positions == Positions::kLearned)
      add("wpe.weight", {c.max_seq_len, C}, S::kReplicated, true, false, -1, 1, false);
    embedding_unit_ = num_units();
    close_unit(0, first);
  }
  for (int l = 0; l < L; l++) {
    if (!held[l]) continue;
    const size_t first = tensors_.size();
    if (gpt2_names) add_gpt2_block(c, l);
    else add_llama_block(c, l);
    block_unit_[l] = num_units();
    close_unit(block_unit_id(c, l), first);
    if (c.is_moe_layer(l)) add_expert_units(c, l);
  }
  if (final_norm) {
    const size_t first = tensors_.size();
    add(gpt2_names ? "ln_f.weight" : "model.norm.weight", {C}, S::kReplicated, false, false, -1, 0, false);
    if (c.norm == Norm::kLayerNorm)
      add(gpt2_names ? "ln_f.bias" : "model.norm.bias", {C}, S::kReplicated, false, false, -1, 1, false);
    if (!c.tied_head) add("lm_head.weight", {c.padded_vocab(), C}, S::kRows, true, false, -1, 2, false);
    final_unit_ = num_units();
    close_unit(final_unit_id(c), first);
  }
}

// GPT-2's block in Hugging Face's names and Conv1D layout: fused c_attn [q; k; v] split by
// heads over tp, biases everywhere.
void ParamLayout::add_gpt2_block(const GptConfig& c, int l) {
  using S = TpSplit;
  const int64_t C = c.dim, F = c.ffn();
  const std::string p = "h." + std::to_string(l) + ".";
  add(p + "ln_1.weight", {C}, S::kReplicated, false, false, l, kLn1W, false);
  add(p + "ln_1.bias", {C}, S::kReplicated, false, false, l, kLn1B, false);
  add(p + "attn.c_attn.weight", {3 * C, C}, S::kQkvRows, true, true, l, kQkvW, true);
  add(p + "attn.c_attn.bias", {3 * C}, S::kQkvRows, false, false, l, kQkvB, false);
  add(p + "attn.c_proj.weight", {C, C}, S::kCols, true, true, l, kAttProjW, true);
  add(p + "attn.c_proj.bias", {C}, S::kReplicated, false, false, l, kAttProjB, false);
  add(p + "ln_2.weight", {C}, S::kReplicated, false, false, l, kLn2W, false);
  add(p + "ln_2.bias", {C}, S::kReplicated, false, false, l, kLn2B, false);
  add(p + "mlp.c_fc.weight", {F, C}, S::kRows, true, true, l, kFcW, true);
  add(p + "mlp.c_fc.bias", {F}, S::kRows, false, false, l, kFcB, false);
  add(p + "mlp.c_proj.weight", {C, F}, S::kCols, true, true, l, kFcProjW, true);
  add(p + "mlp.c_proj.bias", {C}, S::kReplicated, false, false, l, kFcProjB, false);
}

// Any other block in Hugging Face Llama's names ([out, in] weights). q, k, v are separate
// tensors, each split by rows (heads) over tp and laid out back to back, so rank r holds
// [q_r; k_r; v_r]: the fused projection of its heads. gate and up likewise give [gate_r;
// up_r]. A part the architecture lacks (a bias, a norm's bias) has no tensor.
void ParamLayout::add_llama_block(const GptConfig& c, int l) {
  using S = TpSplit;
  const int64_t C = c.dim, KV = c.kv_dim(), F = c.ffn();
  const bool layernorm = c.norm == Norm::kLayerNorm, bias = c.bias, swiglu = c.mlp == Mlp::kSwiGlu;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  add(p + "input_layernorm.weight", {C}, S::kReplicated, false, false, l, kLn1W, false);
  if (layernorm) add(p + "input_layernorm.bias", {C}, S::kReplicated, false, false, l, kLn1B, false);
  add(p + "self_attn.q_proj.weight", {C, C}, S::kRows, true, false, l, kQkvW, true);
  const int NKV = c.kv_head_count();
  add(p + "self_attn.k_proj.weight", {KV, C}, S::kKvHeadRows, true, false, l, -1, true, NKV);
  add(p + "self_attn.v_proj.weight", {KV, C}, S::kKvHeadRows, true, false, l, -1, true, NKV);
  if (bias) {
    add(p + "self_attn.q_proj.bias", {C}, S::kRows, false, false, l, kQkvB, false);
    add(p + "self_attn.k_proj.bias", {KV}, S::kKvHeadRows, false, false, l, -1, false, NKV);
    add(p + "self_attn.v_proj.bias", {KV}, S::kKvHeadRows, false, false, l, -1, false, NKV);
  }
  add(p + "self_attn.o_proj.weight", {C, C}, S::kCols, true, false, l, kAttProjW, true);
  if (bias) add(p + "self_attn.o_proj.bias", {C}, S::kReplicated, false, false, l, kAttProjB, false);
  add(p + "post_attention_layernorm.weight", {C}, S::kReplicated, false, false, l, kLn2W, false);
  if (layernorm) add(p + "post_attention_layernorm.bias", {C}, S::kReplicated, false, false, l, kLn2B, false);
  if (c.is_moe_layer(l)) return add_moe_mlp(c, l, p + "block_sparse_moe.");
  add(p + (swiglu ? "mlp.gate_proj.weight" : "mlp.up_proj.weight"), {F, C}, S::kRows, true, false, l, kFcW, true);
  if (swiglu) add(p + "mlp.up_proj.weight", {F, C}, S::kRows, true, false, l, -1, true);
  if (bias) {
    add(p + (swiglu ? "mlp.gate_proj.bias" : "mlp.up_proj.bias"), {F}, S::kRows, false, false, l, kFcB, false);
    if (swiglu) add(p + "mlp.up_proj.bias", {F}, S::kRows, false, false, l, -1, false);
  }
  add(p + "mlp.down_proj.weight", {C, F}, S::kCols, true, false, l, kFcProjW, true);
  if (bias) add(p + "mlp.down_proj.bias", {C}, S::kReplicated, false, false, l, kFcProjB, false);
}

// An MoE layer's MLP in Mixtral's names: the router (fp32, never a GEMM weight: it is
// computed in fp32 whatever the precision), the shared experts (DeepSeek's, as one MLP of
// shared x expert_ffn) and the routed experts, none with biases.
void ParamLayout::add_moe_mlp(const GptConfig& c, int l, const std::string& p) {
  using S = TpSplit;
  const int64_t C = c.dim, Fe = c.expert_ffn(), Fs = (int64_t)c.moe.shared_experts * Fe;
  const bool swiglu = c.mlp == Mlp::kSwiGlu;
  add(p + "gate.weight", {c.moe.experts, C}, S::kReplicated, true, false, l, kRouterW, false);
  if (Fs > 0) {
    const std::string sp = p + "shared_experts.";
    add(sp + (swiglu ? "gate_proj.weight" : "up_proj.weight"), {Fs, C}, S::kRows, true, false, l, kSharedFcW, true);
    if (swiglu) add(sp + "up_proj.weight", {Fs, C}, S::kRows, true, false, l, -1, true);
    add(sp + "down_proj.weight", {C, Fs}, S::kCols, true, false, l, kSharedProjW, true);
  }
}

// This rank's routed experts of MoE layer l, a unit each, listed by the block's unit.
void ParamLayout::add_expert_units(const GptConfig& c, int l) {
  using S = TpSplit;
  const int64_t C = c.dim, Fe = c.expert_ffn();
  const bool swiglu = c.mlp == Mlp::kSwiGlu;
  const S in = experts_replicated() ? S::kReplicated : S::kRows, out = experts_replicated() ? S::kReplicated : S::kCols;
  const std::string p = "model.layers." + std::to_string(l) + ".block_sparse_moe.experts.";
  for (int e = first_expert_; e < first_expert_ + c.moe.experts / ep_; e++) {
    const std::string ep = p + std::to_string(e) + ".";
    const int fc = (int)tensors_.size();
    add(ep + "w1.weight", {Fe, C}, in, true, false, l, -1, true);
    if (swiglu) add(ep + "w3.weight", {Fe, C}, in, true, false, l, -1, true);
    const int proj = (int)tensors_.size();
    add(ep + "w2.weight", {C, Fe}, out, true, false, l, -1, true);
    for (int t = fc; t < (int)tensors_.size(); t++) tensors_[t].expert = e;
    unit_experts_[block_unit_[l]].push_back({fc, proj});  // (close_unit grows the vector)
    close_unit(moe_unit_id(c, l, e), fc);
    units_.back().expert = e;
  }
}

// Whole-model positions: the embeddings, then each block followed by its experts (an MoE
// layer's), then the final norm.
int block_unit_id(const GptConfig& c, int l) {
  const int moe_before = c.is_moe() ? (l + c.moe.every - 1) / c.moe.every : 0;  // MoE layers < l
  return 1 + l + moe_before * (c.is_moe() ? c.moe.experts : 0);
}

int moe_unit_id(const GptConfig& c, int l, int e) {
  CHECK_MSG(c.is_moe_layer(l), "not an MoE layer");
  return block_unit_id(c, l) + 1 + e;
}

std::string unit_name(const GptConfig& c, int id) {
  if (id == 0) return "embeddings";
  if (id == final_unit_id(c)) return c.tied_head ? "final norm" : "final norm and head";
  for (int l = 0; l < c.layers; l++) {
    const int block = block_unit_id(c, l);
    if (id == block) return "block " + std::to_string(l);
    if (c.is_moe_layer(l) && id > block && id <= block + c.moe.experts)
      return "block " + std::to_string(l) + " expert " + std::to_string(id - block - 1);
  }
  return "unit " + std::to_string(id);
}

int final_unit_id(const GptConfig& c) { return 1 + c.layers + c.moe_layers() * (c.is_moe() ? c.moe.experts : 0); }

// The tensors added since `first_tensor` form the next unit (contiguous by construction).
void ParamLayout::close_unit(int id, size_t first_tensor) {
  const ParamTensor& a = tensors_[first_tensor];
  const ParamTensor& b = tensors_.back();
  const int u = num_units();
  units_.push_back({a.offset, b.offset + b.numel - a.offset, id});
  for (size_t i = first_tensor; i < tensors_.size(); i++) tensors_[i].unit = u;
  unit_slots_.push_back(building_);
  building_.fill(-1);
  unit_experts_.emplace_back();
}

const ParamTensor& ParamLayout::slot(int unit, int k) const {
  CHECK_MSG(has_slot(unit, k), "the model's architecture has no such tensor");
  return tensors_[unit_slots_[unit][k]];
}

int ParamLayout::embedding_unit() const {
  CHECK_MSG(embedding_unit_ >= 0, "this model part holds no embeddings");
  return embedding_unit_;
}

int ParamLayout::block_unit(int l) const {
  CHECK_MSG(has_layer(l), "this model part does not hold the requested layer");
  return block_unit_[l];
}

int ParamLayout::final_unit() const {
  CHECK_MSG(final_unit_ >= 0, "this model part holds no final norm");
  return final_unit_;
}

int ParamLayout::local_unit(int id) const {
  for (int u = 0; u < num_units(); u++)
    if (units_[u].id == id) return u;
  return -1;
}

int ParamLayout::unit_of(const ParamTensor& t) const { return t.unit; }

size_t ParamLayout::offset_in_unit(const ParamTensor& t) const {
  return t.offset - units_[unit_of(t)].offset;
}

void ParamLayout::add(std::string name, std::vector<int64_t> global_shape, TpSplit split,
                      bool decay, bool hf_transposed, int layer, int slot, bool linear, int kv_heads) {
  if (slot >= 0) building_[slot] = (int)tensors_.size();
  ParamTensor t;
  t.name = std::move(name);
  t.split = split;
  t.layer = layer;
  t.kv_heads = kv_heads;
  t.global_shape = global_shape;
  std::vector<int64_t> shape = global_shape;  // dims divisible by tp: validated by the caller
  if (split == TpSplit::kRows || split == TpSplit::kQkvRows) shape[0] /= tp_;
  if (split == TpSplit::kKvHeadRows) shape[0] = shape[0] / kv_heads * std::max(1, kv_heads / tp_);
  t.tp_copy = (split == TpSplit::kReplicated && tp_rank_ > 0) ||
              (split == TpSplit::kKvHeadRows && kv_heads < tp_ && tp_rank_ % (tp_ / kv_heads) != 0);
  if (split == TpSplit::kCols) shape[1] /= tp_;
  t.numel = 1;
  for (int64_t d : shape) t.numel *= (size_t)d;
  t.shape = std::move(shape);
  t.offset = total_;
  t.decay = decay;
  t.hf_transposed = hf_transposed;
  // The token embedding (read by the lookup, and the GEMM of a tied head) and an untied head
  // are the vocabulary-split tensors outside the blocks.
  t.gemm_weight = linear || t.vocabulary_rows();
  t.gemm_grad = linear;
  total_ += t.numel;
  tensors_.push_back(std::move(t));
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

// Calls copy(global_offset, local_offset, count) for every contiguous run of rank r's part.
template <typename Copy>
void for_each_run(const ParamTensor& t, int tp, int r, Copy copy) {
  const auto& g = t.global_shape;
  const size_t cols = g.size() > 1 ? (size_t)g[1] : 1;
  switch (t.split) {
    case TpSplit::kReplicated:
      copy(0, 0, t.numel);
      return;
    case TpSplit::kRows: {
      const size_t rows = (size_t)g[0] / tp;
      copy((size_t)r * rows * cols, 0, rows * cols);
      return;
    }
    case TpSplit::kQkvRows: {  // [q; k; v] blocks of g[0]/3 rows each
      const size_t block = (size_t)g[0] / 3, rows = block / tp;
      for (size_t j = 0; j < 3; j++)
        copy((j * block + r * rows) * cols, j * rows * cols, rows * cols);
      return;
    }
    case TpSplit::kKvHeadRows: {  // heads [first, first + held) of g[0] / kv_heads rows each
      const size_t head_rows = (size_t)g[0] / t.kv_heads;
      const int held = std::max(1, t.kv_heads / tp);
      const int first = t.kv_heads >= tp ? r * held : r / (tp / t.kv_heads);
      copy((size_t)first * head_rows * cols, 0, (size_t)held * head_rows * cols);
      return;
    }
    case TpSplit::kCols: {
      const size_t local_cols = cols / tp;
      for (size_t row = 0; row < (size_t)g[0]; row++)
        copy(row * cols + r * local_cols, row * local_cols, local_cols);
      return;
    }
  }
}

}  // namespace

void global_to_local(const ParamTensor& t, int tp, int tp_rank, const float* global, float* local) {
  for_each_run(t, tp, tp_rank, [&](size_t g, size_t l, size_t n) {
    std::copy(global + g, global + g + n, local + l);
  });
}

void local_to_global(const ParamTensor& t, int tp, int tp_rank, const float* local, float* global) {
  for_each_run(t, tp, tp_rank, [&](size_t g, size_t l, size_t n) {
    std::copy(local + l, local + l + n, global + g);
  });
}

}  // namespace meshtrain::model
