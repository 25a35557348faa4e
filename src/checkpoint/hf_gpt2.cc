#include "checkpoint/hf_gpt2.h"

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

// HF files carry buffers and the tied head beside the weights; anything else is a
// misspelt or foreign tensor and is reported rather than silently ignored.
Status check_no_unknown_tensors(const SafetensorsFile& f, const model::ParamLayout& layout) {
  for (const auto& info : f.tensors()) {
    std::string name = info.name;
    if (name.starts_with("transformer.")) name = name.substr(12);
    if (layout.find(name) || name == "lm_head.weight" || name.ends_with(".attn.bias") ||
        name.ends_with(".attn.masked_bias"))
      continue;
    return Status::error(f.path() + ": unexpected tensor '" + info.name +
                         "' (not a GPT-2 parameter name)");
  }
  return Status::ok();
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
  c.layers = 0;
  while (f.find(file_name(f, "h." + std::to_string(c.layers) + ".ln_1.weight"))) c.layers++;
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
  RETURN_IF_ERROR(check_no_unknown_tensors(f, gpt->layout()));
  // Padded vocabulary rows are zero by contract.
  const auto& wte = gpt->layout().wte();
  std::memset(gpt->params() + wte.offset + (size_t)cfg.vocab * cfg.dim, 0,
              sizeof(float) * (wte.numel - (size_t)cfg.vocab * cfg.dim));
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
