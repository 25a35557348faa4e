#include "model/config.h"

#include <cstdio>
#include <map>

namespace meshtrain::model {

namespace {

GptConfig gpt2(int layers, int heads, int dim, int positions) {
  GptConfig c;
  c.layers = layers, c.heads = heads, c.dim = dim, c.max_seq_len = positions;
  return c;
}

// A Llama: the shape, then Llama's parts (apply_arch), then what the shape overrides.
GptConfig llama(int layers, int heads, int kv_heads, int dim, int ffn, int positions, int vocab, double theta,
                bool tied = false) {
  GptConfig c = gpt2(layers, heads, dim, positions);
  c.vocab = vocab;
  (void)apply_arch("llama", &c);
  c.kv_heads = kv_heads, c.ffn_dim = ffn, c.rope_theta = theta, c.tied_head = tied;
  return c;
}

const std::map<std::string, GptConfig>& presets() {
  static const std::map<std::string, GptConfig> m = [] {
    std::map<std::string, GptConfig> p = {
        {"tiny", gpt2(2, 4, 64, 64)},
        {"small", gpt2(6, 6, 384, 256)},
        {"gpt2-124m", gpt2(12, 12, 768, 1024)},
        {"gpt2-350m", gpt2(24, 16, 1024, 1024)},
        // Trainable here: GQA, RoPE, RMSNorm, SwiGLU. llama-124m ties its head so that its
        // 121M parameters compare with gpt2-124m's (an untied 50k head would add 39M);
        // its MLP is Llama's rule with multiplier 1.125 (2304).
        {"llama-tiny", llama(2, 4, 2, 64, llama_ffn_dim(64, 32), 64, 50257, 10000.0)},
        {"llama-124m", llama(12, 12, 4, 768, llama_ffn_dim(768, 256, 1.125), 1024, 50257, 10000.0, true)},
        // Published shapes (Touvron et al. 2023, Llama 2; Grattafiori et al. 2024, Llama 3
        // and 3.1, whose 128k context comes from RoPE scaling factor 8 over 8192).
        {"llama2-7b", llama(32, 32, 32, 4096, 11008, 4096, 32000, 10000.0)},
        {"llama2-13b", llama(40, 40, 40, 5120, 13824, 4096, 32000, 10000.0)},
        {"llama2-70b", llama(80, 64, 8, 8192, 28672, 4096, 32000, 10000.0)},
        {"llama3-8b", llama(32, 32, 8, 4096, 14336, 8192, 128256, 500000.0)},
        {"llama3-70b", llama(80, 64, 8, 8192, 28672, 8192, 128256, 500000.0)},
        {"llama3-405b", llama(126, 128, 8, 16384, 53248, 131072, 128256, 500000.0)},
    };
    p["llama3-405b"].rope_scaling = {8, 1, 4, 8192};
    return p;
  }();
  return m;
}

}  // namespace

bool GptConfig::is_gpt2() const { return arch_name(*this) == "gpt2" && !is_moe(); }

std::vector<std::string> preset_names() {
  // GPT-2 first, then by family and size (the map's order is alphabetical).
  return {"tiny",      "small",      "gpt2-124m",  "gpt2-350m", "llama-tiny", "llama-124m", "llama2-7b",
          "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b"};
}

Status preset_config(const std::string& name, GptConfig* out) {
  if (auto it = presets().find(name); it != presets().end()) {
    *out = it->second;
    return Status::ok();
  }
  std::string list;
  for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
  return Status::error("unknown model preset '" + name + "' (choose " + list + ")");
}

int llama_ffn_dim(int dim, int multiple_of, double multiplier) {
  const int64_t hidden = (int64_t)(multiplier * (int64_t)(2 * 4 * (int64_t)dim / 3));
  return (int)((hidden + multiple_of - 1) / multiple_of * multiple_of);
}

Status apply_arch(const std::string& arch, GptConfig* c) {
  if (arch == "gpt2") {
    const GptConfig d;
    c->kv_heads = 0, c->ffn_dim = 0, c->norm = d.norm, c->norm_eps = d.norm_eps, c->positions = d.positions;
    c->rope_theta = d.rope_theta, c->rope_scaling = d.rope_scaling, c->mlp = d.mlp, c->bias = true;
    c->tied_head = true;
    return Status::ok();
  }
  if (arch == "llama") {
    c->kv_heads = 0, c->ffn_dim = llama_ffn_dim(c->dim), c->norm = Norm::kRmsNorm, c->norm_eps = 1e-5f;
    c->positions = Positions::kRope, c->rope_theta = 10000.0, c->rope_scaling = {}, c->mlp = Mlp::kSwiGlu;
    c->bias = false, c->tied_head = false;
    return Status::ok();
  }
  return Status::error("--arch must be gpt2 or llama, got '" + arch + "'");
}

std::string arch_name(const GptConfig& c) {
  const bool gpt2_parts = c.norm == Norm::kLayerNorm && c.positions == Positions::kLearned && c.mlp == Mlp::kGelu &&
                          c.bias && c.tied_head && c.kv_head_count() == c.heads && c.ffn() == 4 * c.dim;
  if (gpt2_parts) return "gpt2";
  const bool llama_parts = c.norm == Norm::kRmsNorm && c.positions == Positions::kRope && c.mlp == Mlp::kSwiGlu &&
                           !c.bias;
  return llama_parts ? "llama" : "custom";
}

// ", MoE every 2nd layer: 8 experts of 192, top-2 softmax renormalised, 1 shared", or "".
static std::string describe_moe(const GptConfig& c) {
  if (!c.is_moe()) return "";
  const MoeConfig& m = c.moe;
  std::string s = ", MoE ";
  if (m.every > 1) s += "every " + std::to_string(m.every) + " layers";
  else s += "in every layer";
  s += ": " + std::to_string(m.experts) + " experts of " + std::to_string(c.expert_ffn()) + ", top-" +
       std::to_string(m.top_k) + (m.score == MoeScore::kSoftmax ? " softmax" : " sigmoid") +
       (m.renormalize ? " renormalised" : "");
  if (m.shared_experts > 0) s += ", " + std::to_string(m.shared_experts) + " shared";
  return s;
}

std::string describe_arch(const GptConfig& c) {
  const std::string name = arch_name(c);
  if (name == "gpt2") return c.is_moe() ? name + describe_moe(c) : name;
  std::string s = name + ": " + (c.norm == Norm::kRmsNorm ? "RMSNorm" : "LayerNorm");
  if (c.positions == Positions::kRope) {
    char theta[32];
    std::snprintf(theta, sizeof theta, "%g", c.rope_theta);
    s += std::string(", RoPE ") + theta + (c.rope_scaling.factor > 0 ? " (Llama 3 scaling)" : "");
  } else {
    s += ", learned positions";
  }
  s += ", " + std::to_string(c.kv_head_count()) + " kv heads";
  s += std::string(", ") + (c.mlp == Mlp::kSwiGlu ? "SwiGLU " : "GELU ") + std::to_string(c.ffn());
  s += c.bias ? ", biases" : ", no biases";
  s += c.tied_head ? ", tied head" : ", untied head";
  return s + describe_moe(c);
}

Status validate_moe(const GptConfig& c) {
  const MoeConfig& m = c.moe;
  if (m.experts < 0) return Status::error("--moe-experts must be >= 1 (or 0 for a dense model), got " + std::to_string(m.experts));
  if (m.experts == 0) {
    if (m.shared_experts > 0 || m.expert_ffn > 0)
      return Status::error("--moe-shared-experts and --moe-ffn-dim need --moe-experts");
    return Status::ok();
  }
  // 4096: DeepSeek-V3 routes over 256 experts; past a few thousand a router is not a layer
  // this engine's dispatch (a count per expert per sequence) is built for.
  if (m.experts > 4096) return Status::error("--moe-experts must be at most 4096, got " + std::to_string(m.experts));
  if (m.top_k < 1 || m.top_k > m.experts)
    return Status::error("--moe-top-k must be in [1, --moe-experts " + std::to_string(m.experts) + "], got " +
                         std::to_string(m.top_k));
  if (m.every < 1) return Status::error("--moe-every must be >= 1, got " + std::to_string(m.every));
  if (m.shared_experts < 0 || m.shared_experts > 64)
    return Status::error("--moe-shared-experts must be in [0, 64], got " + std::to_string(m.shared_experts));
  if (m.expert_ffn < 0) return Status::error("--moe-ffn-dim must be >= 1 (or 0: the model's MLP width), got " + std::to_string(m.expert_ffn));
  if (m.top_k == 1 && m.renormalize && m.score == MoeScore::kSoftmax)
    return Status::error("--moe-top-k 1 with renormalised weights makes every weight 1, and the router gets no "
                         "gradient from the loss; use --moe-no-renormalize (Switch) or top-k >= 2");
  return Status::ok();
}

Status validate(const GptConfig& c) {
  if (c.layers < 1) return Status::error("--layers must be >= 1, got " + std::to_string(c.layers));
  if (c.heads < 1) return Status::error("--heads must be >= 1, got " + std::to_string(c.heads));
  if (c.dim < 1) return Status::error("--dim must be >= 1, got " + std::to_string(c.dim));
  if (c.dim % c.heads != 0)
    return Status::error("--heads " + std::to_string(c.heads) + " does not divide --dim " +
                         std::to_string(c.dim));
  if (c.kv_heads < 0 || c.heads % c.kv_head_count() != 0)
    return Status::error("--kv-heads " + std::to_string(c.kv_heads) + " must divide --heads " +
                         std::to_string(c.heads) + " (0: as many as heads)");
  if (c.ffn_dim < 0) return Status::error("--ffn-dim must be >= 1 (or 0 for the default), got " + std::to_string(c.ffn_dim));
  if (c.positions == Positions::kRope && c.head_dim() % 2 != 0)
    return Status::error("rotary positions need an even head width, got dim / heads = " +
                         std::to_string(c.head_dim()));
  if (c.positions == Positions::kRope && !(c.rope_theta > 1))
    return Status::error("--rope-theta must be > 1, got " + std::to_string(c.rope_theta));
  if (!(c.norm_eps > 0)) return Status::error("--norm-eps must be > 0");
  if (c.max_seq_len < 1) return Status::error("--seq-len must be >= 1");
  // 2^24 ids: far past any published vocabulary (Llama 3 128,256; Gemma 256,000), and ids
  // stay exact in fp32 arithmetic.
  if (c.vocab < 2 || c.vocab > (1 << 24))
    return Status::error("--vocab must be in [2, 16777216], got " + std::to_string(c.vocab));
  return validate_moe(c);
}

std::string tp_split_error(int tp, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t expert_ffn,
                           int64_t split_vocab) {
  if (tp < 1) return "--tp must be >= 1, got " + std::to_string(tp);
  auto need = [&](const char* what, int64_t n) {
    return n > 0 && n % tp != 0 ? "--tp " + std::to_string(tp) + " does not divide " + what + " (" + std::to_string(n) + ")"
                                : std::string();
  };
  if (std::string r = need("the number of heads", heads); !r.empty()) return r;
  if (kv_heads % tp != 0 && tp % kv_heads != 0)
    return "--tp " + std::to_string(tp) + " and the " + std::to_string(kv_heads) +
           " key/value heads: the heads must split evenly over the ranks, or divide them "
           "(each head then replicated on tp / heads ranks)";
  for (const std::string& r : {need("the MLP width", ffn), need("the experts' MLP width", expert_ffn),
                               need("the padded vocabulary", split_vocab)})
    if (!r.empty()) return r;
  return "";
}

Status validate_tp(const GptConfig& c, int tp) {
  const std::string why = tp_split_error(tp, c.heads, c.kv_head_count(), c.ffn(), c.is_moe() ? c.expert_ffn() : 0,
                                         c.padded_vocab());
  return why.empty() ? Status::ok() : Status::error(why);
}

std::string ep_split_error(int ep, int experts) {
  if (ep == 1) return "";
  if (experts == 0) return "--ep " + std::to_string(ep) + " needs a Mixture-of-Experts model (--moe-experts)";
  if (experts % ep != 0)
    return "--ep " + std::to_string(ep) + " does not divide the " + std::to_string(experts) + " experts of each MoE layer";
  return "";
}

Status validate_ep(const GptConfig& c, int ep) {
  const std::string why = ep_split_error(ep, c.is_moe() ? c.moe.experts : 0);
  return why.empty() ? Status::ok() : Status::error(why);
}

int64_t num_parameters(const GptConfig& c) {
  const int64_t C = c.dim, L = c.layers, F = c.ffn(), Q = c.qkv_dim();
  const int64_t norm = c.norm == Norm::kLayerNorm ? 2 * C : C;
  const int64_t biases = c.bias ? Q + C + c.fc_dim() + C : 0;
  const int64_t per_layer = 2 * norm + Q * C + C * C + (int64_t)c.fc_dim() * C + F * C + biases;
  const int64_t embeddings = (int64_t)c.vocab * C * (c.tied_head ? 1 : 2) +
                             (c.positions == Positions::kLearned ? (int64_t)c.max_seq_len * C : 0);
  // An MoE layer's MLP is its router, its experts and its shared experts instead (no biases).
  const int64_t Fe = c.expert_ffn(), expert = ((int64_t)c.expert_fc_dim() + Fe) * C;
  const int64_t dense_mlp = (int64_t)c.fc_dim() * C + F * C + (c.bias ? c.fc_dim() + C : 0);
  const int64_t moe_mlp = (int64_t)c.moe.experts * C + (c.moe.experts + c.moe.shared_experts) * expert;
  return embeddings + L * per_layer + c.moe_layers() * (moe_mlp - dense_mlp) + norm;
}

int64_t num_active_parameters(const GptConfig& c) {
  const int64_t C = c.dim, Fe = c.expert_ffn(), expert = ((int64_t)c.expert_fc_dim() + Fe) * C;
  return num_parameters(c) - c.moe_layers() * (int64_t)(c.moe.experts - c.moe.top_k) * expert;
}

}  // namespace meshtrain::model
