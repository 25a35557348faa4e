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

bool GptConfig::is_gpt2() const { return arch_name(*this) == "gpt2"; }

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

std::string describe_arch(const GptConfig& c) {
  const std::string name = arch_name(c);
  if (name == "gpt2") return name;
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
  return s;
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
  return Status::ok();
}

Status validate_tp(const GptConfig& c, int tp) {
  if (tp < 1) return Status::error("--tp must be >= 1, got " + std::to_string(tp));
  auto need = [&](const char* what, int64_t n) -> Status {
    if (n % tp != 0)
      return Status::error("--tp " + std::to_string(tp) + " does not divide " + what + " (" +
                           std::to_string(n) + ")");
    return Status::ok();
  };
  RETURN_IF_ERROR(need("the number of heads", c.heads));
  RETURN_IF_ERROR(need("the MLP width", c.ffn()));
  RETURN_IF_ERROR(need("the padded vocabulary", c.padded_vocab()));
  const int kv = c.kv_head_count();
  if (kv % tp != 0 && tp % kv != 0)
    return Status::error("--tp " + std::to_string(tp) + " and the " + std::to_string(kv) +
                         " key/value heads: the heads must split evenly over the ranks, or divide them "
                         "(each head then replicated on tp / heads ranks)");
  return Status::ok();
}

int64_t num_parameters(const GptConfig& c) {
  const int64_t C = c.dim, L = c.layers, F = c.ffn(), Q = c.qkv_dim();
  const int64_t norm = c.norm == Norm::kLayerNorm ? 2 * C : C;
  const int64_t biases = c.bias ? Q + C + c.fc_dim() + C : 0;
  const int64_t per_layer = 2 * norm + Q * C + C * C + (int64_t)c.fc_dim() * C + F * C + biases;
  const int64_t embeddings = (int64_t)c.vocab * C * (c.tied_head ? 1 : 2) +
                             (c.positions == Positions::kLearned ? (int64_t)c.max_seq_len * C : 0);
  return embeddings + L * per_layer + norm;
}

}  // namespace meshtrain::model
