#include "checkpoint/hf_gpt2.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/hf_gpt2_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_model.h"
#include "core/file_io.h"

namespace meshtrain::checkpoint {

namespace {

void transpose(const float* src, float* dst, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

}  // namespace

void hf_tensors(const model::Gpt& gpt, HfTensors* out) {
  const auto& cfg = gpt.config();
  auto& storage = out->storage;
  auto& tensors = out->tensors;
  storage.reserve(gpt.layout().tensors().size());
  for (const auto& t : gpt.layout().tensors()) {
    const float* src = gpt.params() + t.offset;
    auto shape = hf_shape(t, cfg.vocab);
    if (t.hf_transposed) {
      storage.emplace_back(t.numel);
      transpose(src, storage.back().data(), t.shape[0], t.shape[1]);
      src = storage.back().data();
    }
    tensors.push_back({t.name, shape, src});
  }
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"n_layer", std::to_string(cfg.layers)},
      {"n_head", std::to_string(cfg.heads)},
      {"n_embd", std::to_string(cfg.dim)},
      {"n_positions", std::to_string(cfg.max_seq_len)},
      {"vocab_size", std::to_string(cfg.vocab)},
      {"producer", "meshtrain"}};
  out->metadata = meta;
}

Status set_hf_tensors(const std::map<std::string, HfArray>& arrays, model::Gpt* gpt) {
  const model::ParamLayout& layout = gpt->layout();
  for (const auto& [name, array] : arrays) {
    bool known = false;
    for (const auto& t : layout.tensors()) known |= t.name == name;
    if (!known) return Status::error("tensor " + name + " is not one of this model's (" +
                                     std::to_string(layout.tensors().size()) + " tensors, e.g. " +
                                     layout.tensors().front().name + ")");
  }
  std::fill(gpt->params(), gpt->params() + layout.total(), 0.0f);
  for (const auto& t : layout.tensors()) {
    const auto it = arrays.find(t.name);
    if (it == arrays.end()) return Status::error("tensor " + t.name + " is missing");
    const std::vector<int64_t> shape = hf_shape(t, gpt->config().vocab);
    if (it->second.shape != shape)
      return Status::error("tensor " + t.name + " has shape " + shape_text(it->second.shape) + ", expected " +
                           shape_text(shape));
    size_t count = 1;
    for (int64_t d : shape) count *= (size_t)d;
    float* dst = gpt->params() + t.offset;
    if (t.hf_transposed)
      transpose(it->second.data, dst, t.shape[1], t.shape[0]);
    else
      std::copy(it->second.data, it->second.data + count, dst);
  }
  return Status::ok();
}

Status export_hf_safetensors(const model::Gpt& gpt, const std::string& path) {
  HfTensors hf;
  hf_tensors(gpt, &hf);
  return write_safetensors(path, hf.tensors, hf.metadata);
}

Status export_hf_folder(const model::Gpt& gpt, const std::string& dir, double max_shard_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::error("cannot create " + dir + ": " + ec.message());
  nlohmann::json config;
  RETURN_IF_ERROR(hf_config_json(gpt.config(), &config));
  HfTensors hf;
  hf_tensors(gpt, &hf);
  RETURN_IF_ERROR(write_safetensors_model(dir, hf.tensors, hf.metadata, max_shard_bytes));
  const std::string text = config.dump(2) + "\n";
  return write_file_synced((fs::path(dir) / "config.json").string(), text.data(), text.size());
}

namespace {

// Mixtral's config: its model type, experts and top-k, and the experts' width as
// intermediate_size. What Mixtral cannot say (dense layers between MoE layers, shared
// experts, sigmoid scores, weights not renormalised) goes under "meshtrain_moe", which
// Hugging Face ignores and read_hf_llama_config reads back.
void add_mixtral_fields(const model::GptConfig& cfg, nlohmann::json* c) {
  const model::MoeConfig& m = cfg.moe;
  (*c)["architectures"] = {"MixtralForCausalLM"};
  (*c)["model_type"] = "mixtral";
  (*c)["num_local_experts"] = m.experts;
  (*c)["num_experts_per_tok"] = m.top_k;
  (*c)["intermediate_size"] = cfg.expert_ffn();
  (*c)["output_router_logits"] = false;
  c->erase("mlp_bias");
  const bool mixtral = m.every == 1 && m.shared_experts == 0 && m.score == model::MoeScore::kSoftmax && m.renormalize;
  if (!mixtral)
    (*c)["meshtrain_moe"] = {{"every", m.every}, {"dense_intermediate_size", cfg.ffn()},
                             {"shared_experts", m.shared_experts},
                             {"score", m.score == model::MoeScore::kSigmoid ? "sigmoid" : "softmax"},
                             {"renormalize", m.renormalize}};
}

}  // namespace

Status hf_config_json(const model::GptConfig& cfg, nlohmann::json* out) {
  using model::Mlp, model::Norm, model::Positions;
  if (!cfg.is_gpt2()) {
    if (cfg.norm != Norm::kRmsNorm || cfg.positions != Positions::kRope || cfg.mlp != Mlp::kSwiGlu || cfg.bias)
      return Status::error("Hugging Face has a config for GPT-2 and for Llama, not for this mix of parts (" +
                           model::arch_name(cfg) + ")");
    nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"num_hidden_layers", cfg.layers},
                        {"num_attention_heads", cfg.heads},
                        {"num_key_value_heads", cfg.kv_head_count()},
                        {"hidden_size", cfg.dim},
                        {"intermediate_size", cfg.ffn()},
                        {"max_position_embeddings", cfg.max_seq_len},
                        {"vocab_size", cfg.vocab},
                        {"rms_norm_eps", cfg.norm_eps},
                        {"rope_theta", cfg.rope_theta},
                        {"hidden_act", "silu"},
                        {"attention_bias", false},
                        {"mlp_bias", false},
                        {"tie_word_embeddings", cfg.tied_head},
                        {"torch_dtype", "float32"}};
    if (cfg.is_moe()) add_mixtral_fields(cfg, &c);
    if (cfg.rope_scaling.factor > 0)
      c["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", cfg.rope_scaling.factor},
                           {"low_freq_factor", cfg.rope_scaling.low_freq_factor},
                           {"high_freq_factor", cfg.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", cfg.rope_scaling.original_positions}};
    else
      c["rope_scaling"] = nullptr;
    *out = c;
    return Status::ok();
  }
  *out = {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_layer", cfg.layers},
          {"n_head", cfg.heads},
          {"n_embd", cfg.dim},
          {"n_positions", cfg.max_seq_len},
          {"n_ctx", cfg.max_seq_len},
          {"vocab_size", cfg.vocab},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
  return Status::ok();
}

namespace {

// A model folder's config.json as *j (null when the folder has none), and its path.
Status read_folder_config(const std::string& dir, nlohmann::json* j, std::string* path) {
  *path = (std::filesystem::path(dir) / "config.json").string();
  *j = nullptr;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(*path, ec)) return Status::ok();
  std::string text;
  RETURN_IF_ERROR(read_file(*path, &text));
  *j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j->is_object()) return Status::error(*path + ": not a JSON object");
  return Status::ok();
}

}  // namespace

namespace {

// The inverse of add_mixtral_fields: c holds the Llama fields, intermediate_size read as ffn_dim.
Status read_mixtral_fields(const nlohmann::json& j, const std::string& path, model::GptConfig* c) {
  auto integer = [&](const nlohmann::json& o, const std::string& at, const char* key, int lo, int* out) -> Status {
    if (!o.contains(key) || !o[key].is_number_integer() || o[key].get<int64_t>() < lo || o[key].get<int64_t>() > (1 << 30))
      return Status::error(path + ": \"" + at + key + "\" must be an integer >= " + std::to_string(lo));
    *out = (int)o[key].get<int64_t>();
    return Status::ok();
  };
  model::MoeConfig& m = c->moe;
  RETURN_IF_ERROR(integer(j, "", "num_local_experts", 1, &m.experts));
  RETURN_IF_ERROR(integer(j, "", "num_experts_per_tok", 1, &m.top_k));
  m.expert_ffn = c->ffn_dim;
  if (!j.contains("meshtrain_moe")) return Status::ok();
  const nlohmann::json& x = j["meshtrain_moe"];
  if (!x.is_object()) return Status::error(path + ": \"meshtrain_moe\" must be an object");
  RETURN_IF_ERROR(integer(x, "meshtrain_moe.", "every", 1, &m.every));
  RETURN_IF_ERROR(integer(x, "meshtrain_moe.", "dense_intermediate_size", 1, &c->ffn_dim));
  RETURN_IF_ERROR(integer(x, "meshtrain_moe.", "shared_experts", 0, &m.shared_experts));
  const std::string score = x.value("score", "");
  if (score != "softmax" && score != "sigmoid")
    return Status::error(path + ": \"meshtrain_moe.score\" must be \"softmax\" or \"sigmoid\"");
  m.score = score == "sigmoid" ? model::MoeScore::kSigmoid : model::MoeScore::kSoftmax;
  if (!x.contains("renormalize") || !x["renormalize"].is_boolean())
    return Status::error(path + ": \"meshtrain_moe.renormalize\" must be true or false");
  m.renormalize = x["renormalize"].get<bool>();
  return Status::ok();
}

}  // namespace

Status read_hf_llama_config(const std::string& dir, model::GptConfig* config, bool* is_llama) {
  *is_llama = false;
  nlohmann::json j;
  std::string path;
  RETURN_IF_ERROR(read_folder_config(dir, &j, &path));
  const std::string type = j.is_null() ? "" : j.value("model_type", "");
  if (type != "llama" && type != "mixtral") return Status::ok();
  *is_llama = true;
  auto integer = [&](const char* key, int* out) -> Status {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 1 || j[key].get<int64_t>() > (1 << 30))
      return Status::error(path + ": \"" + key + "\" must be a positive integer");
    *out = (int)j[key].get<int64_t>();
    return Status::ok();
  };
  auto number = [&](const char* key, double fallback, double* out) -> Status {
    if (!j.contains(key)) return *out = fallback, Status::ok();
    if (!j[key].is_number() || !(j[key].get<double>() > 0)) return Status::error(path + ": \"" + key + "\" must be a positive number");
    *out = j[key].get<double>();
    return Status::ok();
  };
  model::GptConfig c;
  RETURN_IF_ERROR(integer("num_hidden_layers", &c.layers));
  RETURN_IF_ERROR(integer("num_attention_heads", &c.heads));
  RETURN_IF_ERROR(integer("hidden_size", &c.dim));
  RETURN_IF_ERROR(integer("vocab_size", &c.vocab));
  RETURN_IF_ERROR(integer("max_position_embeddings", &c.max_seq_len));
  RETURN_IF_ERROR(model::apply_arch("llama", &c));
  RETURN_IF_ERROR(integer("intermediate_size", &c.ffn_dim));
  c.kv_heads = c.heads;
  if (j.contains("num_key_value_heads")) RETURN_IF_ERROR(integer("num_key_value_heads", &c.kv_heads));
  double eps = 0, theta = 0;
  RETURN_IF_ERROR(number("rms_norm_eps", 1e-6, &eps));
  RETURN_IF_ERROR(number("rope_theta", 10000.0, &theta));
  c.norm_eps = (float)eps, c.rope_theta = theta;
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean()) return Status::error(path + ": \"tie_word_embeddings\" must be true or false");
    c.tied_head = j["tie_word_embeddings"].get<bool>();
  }
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j.contains(key) && j[key] == true)
      return Status::error(path + ": \"" + key + "\" is true; meshtrain's Llama has no biases");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const auto& r = j["rope_scaling"];
    const std::string type = r.is_object() ? r.value("rope_type", r.value("type", "")) : "";
    if (type != "llama3")
      return Status::error(path + ": rope_scaling of type '" + type + "' is not supported (only \"llama3\")");
    kernels::RopeScaling s;
    auto field = [&](const char* key, double* out) -> Status {
      if (!r.contains(key) || !r[key].is_number() || !(r[key].get<double>() > 0))
        return Status::error(path + ": rope_scaling." + key + " must be a positive number");
      *out = r[key].get<double>();
      return Status::ok();
    };
    double original = 0;
    RETURN_IF_ERROR(field("factor", &s.factor));
    RETURN_IF_ERROR(field("low_freq_factor", &s.low_freq_factor));
    RETURN_IF_ERROR(field("high_freq_factor", &s.high_freq_factor));
    RETURN_IF_ERROR(field("original_max_position_embeddings", &original));
    s.original_positions = (int)original;
    c.rope_scaling = s;
  }
  if (type == "mixtral") RETURN_IF_ERROR(read_mixtral_fields(j, path, &c));
  RETURN_IF_ERROR(model::validate(c).with_context(path));
  *config = c;
  return Status::ok();
}

Status hf_folder_heads(const std::string& dir, int* heads) {
  *heads = 0;
  nlohmann::json config;
  std::string path;
  RETURN_IF_ERROR(read_folder_config(dir, &config, &path));
  if (config.is_null()) return Status::ok();
  for (const char* key : {"n_head", "num_attention_heads"}) {
    if (!config.contains(key)) continue;
    const auto& v = config[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 20))
      return Status::error(path + ": \"" + key + "\" must be a positive integer");
    *heads = (int)v.get<int64_t>();
    return Status::ok();
  }
  return Status::ok();
}

Status infer_hf_config(const std::string& path, int heads_hint, model::GptConfig* config) {
  SafetensorsModel f;
  RETURN_IF_ERROR(SafetensorsModel::open(path, &f));
  return infer_hf_config(f, heads_hint, config);
}

Status load_hf_safetensors(const std::string& path, model::Gpt* gpt) {
  SafetensorsModel f;
  RETURN_IF_ERROR(SafetensorsModel::open(path, &f));
  const auto& cfg = gpt->config();
  RETURN_IF_ERROR(check_hf_tensors(f, gpt->layout(), cfg.vocab));
  std::vector<float> tmp;
  for (const auto& t : gpt->layout().tensors()) {
    const std::string name = hf_tensor_name(f, t.name);
    const auto want = hf_shape(t, cfg.vocab);
    size_t count = 1;
    for (auto d : want) count *= (size_t)d;
    float* dst = gpt->params() + t.offset;
    if (t.hf_transposed) {
      tmp.resize(count);
      RETURN_IF_ERROR(f.read_float(name, tmp.data(), count));
      transpose(tmp.data(), dst, want[0], want[1]);
    } else {
      RETURN_IF_ERROR(f.read_float(name, dst, count));
    }
  }
  // Padded vocabulary rows (of wte, and of an untied head) are zero by contract.
  for (const auto& t : gpt->layout().tensors())
    if (t.vocabulary_rows())
      std::memset(gpt->params() + t.offset + (size_t)cfg.vocab * cfg.dim, 0,
                  sizeof(float) * (t.numel - (size_t)cfg.vocab * cfg.dim));
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
