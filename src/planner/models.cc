#include "planner/models.h"

#include <map>


namespace meshtrain::planner {

namespace {

model::GptConfig gpt(int layers, int hidden, int heads, int seq, int vocab) {
  model::GptConfig c;
  c.layers = layers, c.dim = hidden, c.heads = heads, c.max_seq_len = seq, c.vocab = vocab;
  return c;
}

// A Llama-parts MoE: the shape, then the experts (docs/moe.md).
model::GptConfig moe_llama(int layers, int hidden, int heads, int kv, int ffn, int seq, int vocab,
                           model::MoeConfig moe) {
  model::GptConfig c = gpt(layers, hidden, heads, seq, vocab);
  (void)model::apply_arch("llama", &c);
  c.kv_heads = kv, c.ffn_dim = ffn, c.moe = moe;
  return c;
}

const std::map<std::string, model::GptConfig>& published_gpts() {
  static const std::map<std::string, model::GptConfig> m = [] {
    std::map<std::string, model::GptConfig> p = {
        {"gpt3-1.3b", gpt(24, 2048, 16, 2048, 51200)},
        {"gpt3-13b", gpt(40, 5120, 40, 2048, 51200)},
        {"gpt3-175b", gpt(96, 12288, 96, 2048, 51200)},
        {"megatron-1t", gpt(128, 25600, 160, 2048, 51200)},
        // Mixtral 8x7B (Jiang et al. 2024): Mistral 7B's blocks, 8 experts of 14336, top-2;
        // 46.7B parameters, 12.9B active.
        {"mixtral-8x7b", moe_llama(32, 4096, 32, 8, 14336, 4096, 32000, {8, 2, 1, 0, 14336})},
        // DeepSeek-V3-shaped (arXiv 2412.19437): 61 layers of 7168, 256 experts of 2048, top-8
        // with sigmoid scores, one shared expert. Its multi-head latent attention and its
        // first three dense layers are not modelled: 128-head attention, every layer MoE.
        {"deepseek-v3-shaped", moe_llama(61, 7168, 128, 128, 18432, 4096, 129280,
                                         {256, 8, 1, 1, 2048, model::MoeScore::kSigmoid, true})},
    };
    // Switch-style (Fedus et al. 2021, Switch-Base 128's widths in a decoder): GPT-2 parts,
    // 128 experts of 3072, top-1 not renormalised, in every other layer.
    model::GptConfig sw = gpt(12, 768, 12, 1024, 32128);
    sw.moe = {128, 1, 2, 0, 0, model::MoeScore::kSoftmax, false};
    p["switch-base-128"] = sw;
    return p;
  }();
  return m;
}

// The sequence length a preset was pre-trained at, where that is not its max_seq_len.
int pretraining_seq(const std::string& name, const model::GptConfig& c) {
  if (name.rfind("llama2-", 0) == 0) return 4096;
  if (name.rfind("llama3-", 0) == 0) return 8192;
  return c.max_seq_len;
}

}  // namespace

std::vector<std::string> planning_model_names() {
  std::vector<std::string> names = model::preset_names();
  for (const auto& [name, shape] : published_gpts()) names.push_back(name);
  return names;
}

Status planning_config(const std::string& name, model::GptConfig* config, int* seq) {
  if (auto it = published_gpts().find(name); it != published_gpts().end()) {
    *config = it->second;
    *seq = config->max_seq_len;
    return Status::ok();
  }
  if (model::preset_config(name, config).is_ok()) {
    *seq = pretraining_seq(name, *config);
    return Status::ok();
  }
  std::string list;
  for (const auto& n : planning_model_names()) list += (list.empty() ? "" : ", ") + n;
  return Status::error("unknown model '" + name + "' (choose " + list + ", or give --layers --dim --heads)");
}

Status planning_model(const std::string& name, ModelShape* out) {
  model::GptConfig c;
  int seq = 0;
  RETURN_IF_ERROR(planning_config(name, &c, &seq));
  *out = model_shape(c, seq);
  return Status::ok();
}

}  // namespace meshtrain::planner
