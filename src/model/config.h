// The model's shape and architecture, and their validation. One record describes every
// model the engine builds: a decoder-only transformer whose block is put together from
// parts (the norm, the positions, the MLP, the attention's key/value heads, biases, the
// head). GPT-2 and Llama are two settings of it (presets below), not two models.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/ops.h"

namespace meshtrain::model {

enum class Norm { kLayerNorm, kRmsNorm };   // LayerNorm has a bias; RMSNorm none
enum class Positions { kLearned, kRope };   // a learned table (wpe), or rotary (no parameters)
enum class Mlp { kGelu, kSwiGlu };          // GELU(x W1) W2, or (silu(x Wg) * x Wu) W2
enum class MoeScore { kSoftmax, kSigmoid };  // how router logits become expert scores

// Mixture-of-Experts MLPs (docs/moe.md): in every `every`-th block (layers l with
// l % every == 0, Megatron's placement) the MLP becomes a router and `experts` expert MLPs
// of the model's MLP type (GELU or SwiGLU, no biases), of which each token uses `top_k`,
// plus `shared_experts` that every token uses with weight 1 (DeepSeek's). The balancing
// losses and the capacity are training settings (model::MoeTraining), not the architecture.
struct MoeConfig {
  int experts = 0;         // routed experts per MoE layer; 0: a dense model
  int top_k = 2;
  int every = 1;
  int shared_experts = 0;
  int expert_ffn = 0;      // each expert's hidden width (0: the model's ffn())
  MoeScore score = MoeScore::kSoftmax;
  bool renormalize = true;  // the chosen top-k weights rescaled to sum to 1 (Mixtral)
};

struct GptConfig {
  int layers = 2;
  int heads = 4;
  int dim = 128;
  int max_seq_len = 64;  // positions: rows of wpe, or of the rotary tables
  int vocab = 50257;
  // Architecture parts; the defaults are GPT-2's.
  int kv_heads = 0;  // key/value heads (0: heads, multi-head); must divide heads
  int ffn_dim = 0;   // the MLP's hidden width (0: 4 x dim)
  Norm norm = Norm::kLayerNorm;
  float norm_eps = 1e-5f;
  Positions positions = Positions::kLearned;
  double rope_theta = 10000.0;
  kernels::RopeScaling rope_scaling;  // Llama 3's (factor 0: none)
  Mlp mlp = Mlp::kGelu;
  bool bias = true;        // biases on the linear layers (and LayerNorm's)
  bool tied_head = true;   // the head's weight is wte; else a tensor of its own
  MoeConfig moe;

  // The token embedding is stored with this many rows (a multiple of 128, as llm.c);
  // rows >= vocab are zero and never produce logits.
  int padded_vocab() const { return (vocab + 127) / 128 * 128; }
  int head_dim() const { return dim / heads; }
  int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int kv_dim() const { return kv_head_count() * head_dim(); }
  // Rows of the fused q, k, v projection: dim + 2 x kv_dim.
  int qkv_dim() const { return dim + 2 * kv_dim(); }
  // Key/value heads one of tp ranks holds: its share, or one when there are fewer heads
  // than ranks (each head then replicated on tp / kv ranks, as Megatron does).
  int kv_heads_per_rank(int tp) const { return kv_head_count() >= tp ? kv_head_count() / tp : 1; }
  // How many tp ranks hold each key/value head (1 unless replicated).
  int kv_replicas(int tp) const { return kv_head_count() >= tp ? 1 : tp / kv_head_count(); }
  // Rows of one tp rank's fused q, k, v projection.
  int qkv_dim_per_rank(int tp) const { return dim / tp + 2 * kv_heads_per_rank(tp) * head_dim(); }
  int ffn() const { return ffn_dim > 0 ? ffn_dim : 4 * dim; }
  // Rows of the MLP's first projection: ffn, or [gate; up] = 2 x ffn for SwiGLU.
  int fc_dim() const { return mlp == Mlp::kSwiGlu ? 2 * ffn() : ffn(); }
  bool is_gpt2() const;  // every part GPT-2's (and no experts)
  bool is_moe() const { return moe.experts > 0; }
  bool is_moe_layer(int l) const { return is_moe() && l % moe.every == 0; }
  int moe_layers() const { return is_moe() ? (layers + moe.every - 1) / moe.every : 0; }
  // One expert's hidden width, and the rows of its first projection (2x for SwiGLU).
  int expert_ffn() const { return moe.expert_ffn > 0 ? moe.expert_ffn : ffn(); }
  int expert_fc_dim() const { return mlp == Mlp::kSwiGlu ? 2 * expert_ffn() : expert_ffn(); }
};

// Known presets: tiny, small, gpt2-124m, gpt2-350m (GPT-2), llama-tiny, llama-124m (Llama
// parts, trainable here), and the published shapes llama2-7b, llama2-13b, llama2-70b,
// llama3-8b, llama3-70b, llama3-405b (for the planner and for import). Returns an error
// naming the choices.
Status preset_config(const std::string& name, GptConfig* out);
std::vector<std::string> preset_names();

// The parts of an architecture family ("gpt2" or "llama") applied to c, keeping its shape
// (layers, heads, dim, positions, vocabulary): Llama's are RMSNorm (eps 1e-5), RoPE (theta
// 10000), SwiGLU with Llama's hidden width rule, no biases and an untied head.
Status apply_arch(const std::string& arch, GptConfig* c);
// Llama's MLP width: 2/3 of 4 x dim, times `multiplier`, rounded up to a multiple of
// `multiple_of` (Meta's reference: 11008 for dim 4096, multiple 256).
int llama_ffn_dim(int dim, int multiple_of = 256, double multiplier = 1.0);
// "gpt2" when every part is GPT-2's, "llama" when every part is Llama's, else "custom".
std::string arch_name(const GptConfig& c);
// The parts in words for run headers: "gpt2", or e.g. "llama: RMSNorm, RoPE 10000, 2 kv heads,
// SwiGLU 192, no biases, untied head".
std::string describe_arch(const GptConfig& c);

// Rejects shapes the engine cannot run, with a message naming the problem (validate_moe:
// the experts' part of it).
Status validate(const GptConfig& c);
Status validate_moe(const GptConfig& c);

// Rejects a tensor-parallel size that does not divide heads, the MLP width or the padded
// vocabulary, or whose key/value heads neither split evenly over tp nor divide it (fewer
// heads than ranks are replicated: kv_replicas).
Status validate_tp(const GptConfig& c, int tp);
// The rule itself, on widths ("" when tp splits them; 0 skips a width): the one statement of
// Megatron's splits, for the engine's models and the planner's (parallel/layout.h).
std::string tp_split_error(int tp, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t expert_ffn,
                           int64_t split_vocab);

// Rejects an expert-parallel size that is not 1 for a dense model, or does not divide the
// experts.
Status validate_ep(const GptConfig& c, int ep);
// The rule itself: experts 0 is a dense model ("" when ep splits them).
std::string ep_split_error(int ep, int experts);

// Parameters as a user counts them: a tied head once, padding rows excluded, every expert.
int64_t num_parameters(const GptConfig& c);
// The parameters one token's forward uses: num_parameters less the routed experts it does
// not visit (experts - top_k of them in each MoE layer). Equal to num_parameters when dense.
int64_t num_active_parameters(const GptConfig& c);

}  // namespace meshtrain::model
