#include "checkpoint/hf_gpt2.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "checkpoint/safetensors.h"

namespace meshtrain::checkpoint {

namespace {

// The file's tensor name for an engine tensor: the same, possibly with a prefix.
std::string file_name(const SafetensorsFile& f, const std::string& name) {
  if (f.find(name)) return name;
  if (f.find("transformer." + name)) return "transformer." + name;
  return name;
}

// Shape of a tensor as HF stores it.
std::vector<int64_t> hf_shape(const model::ParamTensor& t, int vocab) {
  if (t.name == "wte.weight") return {vocab, t.shape[1]};
  if (t.hf_transposed) return {t.shape[1], t.shape[0]};
  return t.shape;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void transpose(const float* src, float* dst, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

// Names the tensors the model needs but the file lacks, and the file's tensors that are
// not GPT-2 parameters (HF's attention-mask buffers and tied lm_head excepted): a misspelt
// name shows up in both lists, which makes the mistake obvious.
Status check_tensor_names(const SafetensorsFile& f, const model::ParamLayout& layout) {
  std::vector<std::string> missing_names, unexpected_names;
  for (const auto& t : layout.tensors())
    if (!f.find(file_name(f, t.name))) missing_names.push_back(t.name);
  for (const auto& info : f.tensors()) {
    std::string name = info.name;
    if (name.starts_with("transformer.")) name = name.substr(12);
    if (layout.find(name) || name == "lm_head.weight" || name.ends_with(".attn.bias") ||
        name.ends_with(".attn.masked_bias"))
      continue;
    unexpected_names.push_back(info.name);
  }
  // At most five names each: a foreign file should not print hundreds.
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size() && i < 5; i++) out += (i ? ", '" : "'") + names[i] + "'";
    if (names.size() > 5) out += " and " + std::to_string(names.size() - 5) + " more";
    return out;
  };
  const std::string missing = list(missing_names), unexpected = list(unexpected_names);
  if (missing.empty() && unexpected.empty()) return Status::ok();
  std::string msg = f.path() + ":";
  if (!missing.empty()) msg += " missing tensor " + missing + ";";
  if (!unexpected.empty()) msg += " unexpected tensor " + unexpected + " (not a GPT-2 parameter name);";
  msg.pop_back();
  return Status::error(msg);
}

// 1 + the highest block index named in the file, so a misspelt tensor inside a block is
// reported by name later instead of silently shortening the model.
int count_layers(const SafetensorsFile& f) {
  int layers = 0;
  for (const auto& info : f.tensors()) {
    std::string name = info.name;
    if (name.starts_with("transformer.")) name = name.substr(12);
    if (!name.starts_with("h.")) continue;
    layers = std::max(layers, std::atoi(name.c_str() + 2) + 1);
  }
  return layers;
}

}  // namespace

Status export_hf_safetensors(const model::Gpt& gpt, const std::string& path) {
  const auto& cfg = gpt.config();
  std::vector<std::vector<float>> storage;  // transposed copies must outlive the write
  std::vector<TensorToWrite> tensors;
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
  return write_safetensors(path, tensors, meta);
}

Status infer_hf_config(const std::string& path, int heads_hint, model::GptConfig* config) {
  SafetensorsFile f;
  RETURN_IF_ERROR(SafetensorsFile::open(path, &f));
  const TensorInfo* wte = f.find(file_name(f, "wte.weight"));
  const TensorInfo* wpe = f.find(file_name(f, "wpe.weight"));
  if (!wte || !wpe)
    return Status::error(path + ": not a GPT-2 checkpoint (no wte.weight / wpe.weight tensor)");
  if (wte->shape.size() != 2 || wpe->shape.size() != 2 || wte->shape[1] != wpe->shape[1])
    return Status::error(path + ": wte.weight " + shape_str(wte->shape) + " and wpe.weight " +
                         shape_str(wpe->shape) + " are not [vocab, C] and [positions, C]");
  model::GptConfig c;
  c.vocab = (int)wte->shape[0];
  c.dim = (int)wte->shape[1];
  c.max_seq_len = (int)wpe->shape[0];
  c.layers = count_layers(f);
  auto meta = f.metadata().find("n_head");
  if (meta != f.metadata().end()) {
    c.heads = std::atoi(meta->second.c_str());
    if (heads_hint > 0 && heads_hint != c.heads)
      return Status::error(path + " was trained with " + meta->second + " heads, but --heads " +
                           std::to_string(heads_hint) + " was given");
  } else {
    c.heads = heads_hint > 0 ? heads_hint : std::max(1, c.dim / 64);
  }
  RETURN_IF_ERROR(model::validate(c).with_context(path));
  *config = c;
  return Status::ok();
}

Status load_hf_safetensors(const std::string& path, model::Gpt* gpt) {
  SafetensorsFile f;
  RETURN_IF_ERROR(SafetensorsFile::open(path, &f));
  const auto& cfg = gpt->config();
  RETURN_IF_ERROR(check_tensor_names(f, gpt->layout()));
  std::vector<float> tmp;
  for (const auto& t : gpt->layout().tensors()) {
    const std::string name = file_name(f, t.name);
    const TensorInfo* info = f.find(name);
    if (!info) return Status::error(path + ": missing tensor '" + t.name + "'");
    auto want = hf_shape(t, cfg.vocab);
    if (info->shape != want)
      return Status::error(path + ": tensor '" + name + "' has shape " + shape_str(info->shape) +
                           ", expected " + shape_str(want));
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
  // Padded vocabulary rows are zero by contract.
  const auto& wte = gpt->layout().wte();
  std::memset(gpt->params() + wte.offset + (size_t)cfg.vocab * cfg.dim, 0,
              sizeof(float) * (wte.numel - (size_t)cfg.vocab * cfg.dim));
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
