#include "checkpoint/hf_gpt2_config.h"

#include <algorithm>
#include <climits>

namespace meshtrain::checkpoint {

namespace {

// Far beyond any real model; keeps a header's block index from overflowing an int.
constexpr int64_t kMaxBlockIndex = 1'000'000;

std::string without_prefix(const std::string& name) {
  return name.starts_with("transformer.") ? name.substr(12) : name;
}

// i for a tensor named "h.{i}.<rest>" (decimal digits, optionally prefixed), else -1; a
// malformed name is left for check_hf_tensors to report by name.
int64_t block_index(const std::string& full_name) {
  const std::string name = without_prefix(full_name);
  if (!name.starts_with("h.")) return -1;
  size_t i = 2;
  int64_t v = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && v <= kMaxBlockIndex) v = v * 10 + (name[i++] - '0');
  if (i == 2 || i >= name.size() || name[i] != '.' || v > kMaxBlockIndex) return -1;
  return v;
}

// 1 + the highest block index named in the file, so a misspelt tensor inside a block is
// reported by name later instead of silently shortening the model. A file naming more
// blocks than it has block tensors is rejected here, so the layout built to name missing
// tensors is never larger than 12 entries per tensor of the file.
Status count_layers(const SafetensorsModel& f, int* layers) {
  int64_t highest = -1, in_blocks = 0;
  for (const auto& info : f.tensors()) {
    const int64_t b = block_index(info.name);
    if (b < 0) continue;
    highest = std::max(highest, b);
    in_blocks++;
  }
  if (in_blocks < highest + 1)
    return Status::error(f.path() + ": names block h." + std::to_string(highest) + " but holds only " +
                         std::to_string(in_blocks) + " block tensors (12 per block)");
  *layers = (int)(highest + 1);
  return Status::ok();
}

// At most five names: a foreign file should not print hundreds.
std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 5; i++) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 5) out += " and " + std::to_string(names.size() - 5) + " more";
  return out;
}

// Names the tensors the model needs but the file lacks, and the file's tensors that are
// not GPT-2 parameters (HF's attention-mask buffers and tied lm_head excepted): a misspelt
// name shows up in both lists, which makes the mistake obvious.
Status check_tensor_names(const SafetensorsModel& f, const model::ParamLayout& layout) {
  std::vector<std::string> missing_names, unexpected_names;
  for (const auto& t : layout.tensors())
    if (!f.find(hf_tensor_name(f, t.name))) missing_names.push_back(t.name);
  for (const auto& info : f.tensors()) {
    const std::string name = without_prefix(info.name);
    if (layout.find(name) || name == "lm_head.weight" || name.ends_with(".attn.bias") ||
        name.ends_with(".attn.masked_bias"))
      continue;
    unexpected_names.push_back(info.name);
  }
  const std::string missing = list_names(missing_names), unexpected = list_names(unexpected_names);
  if (missing.empty() && unexpected.empty()) return Status::ok();
  std::string msg = f.path() + ":";
  if (!missing.empty()) msg += " missing tensor " + missing + ";";
  if (!unexpected.empty()) msg += " unexpected tensor " + unexpected + " (not a GPT-2 parameter name);";
  msg.pop_back();
  return Status::error(msg);
}

bool is_float_dtype(const std::string& d) { return d == "F32" || d == "F16" || d == "BF16" || d == "F64"; }

// A positive decimal integer that fits an int, as the metadata's values are written.
bool parse_positive_int(const std::string& s, int* out) {
  if (s.empty() || s.size() > 10) return false;
  int64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + (ch - '0');
  }
  if (v < 1 || v > INT_MAX) return false;
  *out = (int)v;
  return true;
}

Status infer_heads(const SafetensorsModel& f, int heads_hint, int dim, int* heads) {
  auto meta = f.metadata().find("n_head");
  if (meta == f.metadata().end()) {
    *heads = heads_hint > 0 ? heads_hint : std::max(1, dim / 64);
    return Status::ok();
  }
  if (!parse_positive_int(meta->second, heads))
    return Status::error(f.path() + ": metadata \"n_head\" is '" + meta->second + "', not a positive integer");
  if (heads_hint > 0 && heads_hint != *heads)
    return Status::error(f.path() + " was trained with " + meta->second + " heads, but --heads " +
                         std::to_string(heads_hint) + " was given");
  return Status::ok();
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); i++) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string hf_tensor_name(const SafetensorsModel& f, const std::string& name) {
  if (f.find(name)) return name;
  if (f.find("transformer." + name)) return "transformer." + name;
  return name;
}

std::vector<int64_t> hf_shape(const model::ParamTensor& t, int vocab) {
  if (t.vocabulary_rows()) return {vocab, t.shape[1]};  // wte, lm_head: unpadded
  if (t.hf_transposed) return {t.shape[1], t.shape[0]};
  return t.shape;
}

Status infer_hf_config(const SafetensorsModel& f, int heads_hint, model::GptConfig* config) {
  const std::string& path = f.path();
  const TensorInfo* wte = f.find(hf_tensor_name(f, "wte.weight"));
  const TensorInfo* wpe = f.find(hf_tensor_name(f, "wpe.weight"));
  if (!wte || !wpe)
    return Status::error(path + ": not a GPT-2 checkpoint (no wte.weight / wpe.weight tensor)");
  const auto fits_int = [](const std::vector<int64_t>& s) {
    return std::all_of(s.begin(), s.end(), [](int64_t d) { return d <= INT_MAX; });
  };
  if (wte->shape.size() != 2 || wpe->shape.size() != 2 || wte->shape[1] != wpe->shape[1] ||
      !fits_int(wte->shape) || !fits_int(wpe->shape))
    return Status::error(path + ": wte.weight " + shape_text(wte->shape) + " and wpe.weight " +
                         shape_text(wpe->shape) + " are not [vocab, C] and [positions, C]");
  model::GptConfig c;
  c.vocab = (int)wte->shape[0];
  c.dim = (int)wte->shape[1];
  c.max_seq_len = (int)wpe->shape[0];
  RETURN_IF_ERROR(count_layers(f, &c.layers));
  RETURN_IF_ERROR(infer_heads(f, heads_hint, c.dim, &c.heads));
  RETURN_IF_ERROR(model::validate(c).with_context(path));
  RETURN_IF_ERROR(check_hf_tensors(f, model::ParamLayout(c), c.vocab));
  *config = c;
  return Status::ok();
}

Status check_hf_tensors(const SafetensorsModel& f, const model::ParamLayout& layout, int vocab) {
  RETURN_IF_ERROR(check_tensor_names(f, layout));
  for (const auto& t : layout.tensors()) {
    const std::string name = hf_tensor_name(f, t.name);
    const TensorInfo* info = f.find(name);
    const auto want = hf_shape(t, vocab);
    if (info->shape != want)
      return Status::error(f.path() + ": tensor '" + name + "' has shape " + shape_text(info->shape) +
                           ", expected " + shape_text(want));
    if (!is_float_dtype(info->dtype))
      return Status::error(f.path() + ": tensor '" + name + "' has dtype " + info->dtype +
                           ", not a float type (F32, F16, BF16 or F64)");
  }
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
