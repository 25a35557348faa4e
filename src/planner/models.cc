#include "planner/models.h"

#include <map>

#include "model/config.h"

namespace meshtrain::planner {

namespace {

const std::map<std::string, ModelShape>& published() {
  // {layers, hidden, heads, seq, vocab}
  static const std::map<std::string, ModelShape> m = {
      {"gpt3-1.3b", {24, 2048, 16, 2048, 51200}},   {"gpt3-13b", {40, 5120, 40, 2048, 51200}},
      {"gpt3-175b", {96, 12288, 96, 2048, 51200}},  {"megatron-1t", {128, 25600, 160, 2048, 51200}},
      {"llama-7b", {32, 4096, 32, 4096, 32000}},    {"llama-13b", {40, 5120, 40, 4096, 32000}},
      {"llama-70b", {80, 8192, 64, 4096, 32000}},
  };
  return m;
}

}  // namespace

std::vector<std::string> planning_model_names() {
  std::vector<std::string> names = {"tiny", "small", "gpt2-124m", "gpt2-350m"};
  for (const auto& [name, shape] : published()) names.push_back(name);
  return names;
}

Status planning_model(const std::string& name, ModelShape* out) {
  if (auto it = published().find(name); it != published().end()) {
    *out = it->second;
    return Status::ok();
  }
  model::GptConfig c;
  if (model::preset_config(name, &c).is_ok()) {
    *out = model_shape(c);
    return Status::ok();
  }
  std::string list;
  for (const auto& n : planning_model_names()) list += (list.empty() ? "" : ", ") + n;
  return Status::error("unknown model '" + name + "' (choose " + list + ", or give --layers --dim --heads)");
}

}  // namespace meshtrain::planner
