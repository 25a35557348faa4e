// GPT-2 weights in Hugging Face's safetensors layout (names "wte.weight",
// "h.{i}.attn.c_attn.weight", ...; Conv1D weights stored [in, out]; unpadded vocabulary).
#pragma once
#include <memory>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/status.h"
#include "model/gpt.h"

namespace meshtrain::checkpoint {

// The model's weights in HF names and layouts (fp32, layout order), with the metadata the
// files carry; `storage` holds the tensors that HF stores transposed.
struct HfTensors {
  std::vector<std::vector<float>> storage;
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::string> metadata;
};
void hf_tensors(const model::Gpt& gpt, HfTensors* out);
// The inverse, from arrays in memory (the Python module's): every tensor of the model's layout
// must be in `arrays` under its HF name with HF's shape, and nothing else may be; each error
// names the tensor. The padded vocabulary rows become zero.
struct HfArray {
  std::vector<int64_t> shape;
  const float* data = nullptr;
};
Status set_hf_tensors(const std::map<std::string, HfArray>& arrays, model::Gpt* gpt);

// Writes the model's weights as fp32 in HF GPT-2 names and layouts, with the head count
// and shape in __metadata__. Atomic.
Status export_hf_safetensors(const model::Gpt& gpt, const std::string& path);
// A Hugging Face model folder: the weights as above, in `dir`/model.safetensors or, past
// `max_shard_bytes` (Hugging Face's save_pretrained default: 5 GB), in shards with
// model.safetensors.index.json (checkpoint/safetensors_model.h), and `dir`/config.json, a
// GPT2Config (model_type "gpt2", GPT2LMHeadModel, the shape, tied embeddings, GELU's tanh
// form, LayerNorm epsilon 1e-5) or a LlamaConfig. The tokenizer files are
// data::write_hf_tokenizer's.
inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr double kHfMaxShardBytes = 5e9;
// Hugging Face's config.json for the model: a GPT2Config, or a LlamaConfig (GQA, RoPE with
// Llama 3 scaling, SwiGLU width, RMSNorm epsilon, tied or untied head). Other mixes of
// parts have no Hugging Face config: an error.
Status hf_config_json(const model::GptConfig& config, nlohmann::json* out);
Status export_hf_folder(const model::Gpt& gpt, const std::string& dir, double max_shard_bytes = kHfMaxShardBytes);
// A Hugging Face LlamaConfig (config.json's model_type "llama") as the model record: the
// shape, GQA, SwiGLU width, RMSNorm epsilon, rotary theta and Llama 3 scaling, tied or
// untied head. *is_llama is false (and *config untouched) for another model_type.
Status read_hf_llama_config(const std::string& dir, model::GptConfig* config, bool* is_llama);
// The head count a folder's config.json gives ("n_head", or "num_attention_heads"); 0 when
// the folder has no config.json or it names no heads.
Status hf_folder_heads(const std::string& dir, int* heads);

// Infers layers, width, vocabulary and positions from the file's tensor shapes; the head
// count comes from the file's metadata ("n_head"), else `heads_hint` (> 0), else width/64.
// Accepts an optional "transformer." prefix and ignores HF's attention-mask buffers and
// the tied lm_head. Wrong names, shapes or dtypes, or a truncated file, give a clear error
// before any model is built (the checks are listed in hf_gpt2_config.h).
Status infer_hf_config(const std::string& path, int heads_hint, model::GptConfig* config);
// Loads the weights into `gpt`, whose config must match the file (see infer_hf_config).
// `path` is a .safetensors file or a sharded model's index (.index.json).
Status load_hf_safetensors(const std::string& path, model::Gpt* gpt);

}  // namespace meshtrain::checkpoint
