#include "planner/models.h"

#include <map>


namespace meshtrain::planner {

namespace {

model::GptConfig gpt(int layers, int hidden, int heads, int seq, int vocab) {
  model::GptConfig c;
  c.layers = layers, c.dim = hidden, c.heads = heads, c.max_seq_len = seq, c.vocab = vocab;
  return c;
}

const std::map<std::string, model::GptConfig>& published_gpts() {
  static const std::map<std::string, model::GptConfig> m = {
      {"gpt3-1.3b", gpt(24, 2048, 16, 2048, 51200)},
      {"gpt3-13b", gpt(40, 5120, 40, 2048, 51200)},
      {"gpt3-175b", gpt(96, 12288, 96, 2048, 51200)},
      {"megatron-1t", gpt(128, 25600, 160, 2048, 51200)},
  };
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
