#include "checkpoint/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/file_io.h"

namespace meshtrain::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

json model_json(const model::GptConfig& c) {
  return {{"layers", c.layers}, {"heads", c.heads}, {"dim", c.dim},
          {"max_seq_len", c.max_seq_len}, {"vocab", c.vocab}};
}

json tensors_json(const model::ParamLayout& layout) {
  json out = json::array();
  for (const auto& t : layout.tensors())
    out.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}});
  return out;
}

Status write_data_file(const fs::path& dir, const std::string& name,
                       const std::vector<std::pair<const float*, size_t>>& parts, json* files) {
  // Concatenate parts (weights, or m then v) so the checksum covers the file exactly.
  size_t total = 0;
  for (auto& [p, n] : parts) total += n;
  std::vector<float> buf(total);
  size_t at = 0;
  for (auto& [p, n] : parts) std::memcpy(buf.data() + at, p, n * sizeof(float)), at += n;
  const size_t bytes = total * sizeof(float);
  RETURN_IF_ERROR(write_file_synced((dir / name).string(), buf.data(), bytes));
  (*files)[name] = {{"bytes", bytes}, {"checksum", to_hex(checksum64(buf.data(), bytes))}};
  return Status::ok();
}

Status read_data_file(const std::string& dir, const json& index, const std::string& name,
                      std::vector<float>* out) {
  std::string bytes;
  const std::string path = (fs::path(dir) / name).string();
  RETURN_IF_ERROR(read_file(path, &bytes));
  const json& meta = index["files"][name];
  if (bytes.size() != meta["bytes"].get<size_t>())
    return Status::error(path + " is truncated or has the wrong size (" +
                         std::to_string(bytes.size()) + " bytes, index says " +
                         std::to_string(meta["bytes"].get<size_t>()) + ")");
  if (to_hex(checksum64(bytes.data(), bytes.size())) != meta["checksum"].get<std::string>())
    return Status::error(path + " is corrupt: checksum mismatch");
  out->resize(bytes.size() / sizeof(float));
  std::memcpy(out->data(), bytes.data(), bytes.size());
  return Status::ok();
}

void remove_old_checkpoints(const fs::path& root, int keep) {
  if (keep <= 0) return;
  std::vector<fs::path> dirs;
  for (auto& e : fs::directory_iterator(root)) {
    auto name = e.path().filename().string();
    if (e.is_directory() && name.starts_with("step_") && !name.ends_with(".tmp"))
      dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; i + keep < dirs.size(); i++) fs::remove_all(dirs[i]);
}

}  // namespace

Status save_checkpoint(const std::string& out_dir, int64_t step, const model::Gpt& gpt,
                       const optim::AdamW& opt, const json& run_config, int keep) {
  const fs::path root = fs::path(out_dir) / "checkpoints";
  const fs::path final_dir = root / step_dir_name(step);
  const fs::path tmp_dir = root / (step_dir_name(step) + ".tmp");
  std::error_code ec;
  fs::create_directories(root, ec);
  fs::remove_all(tmp_dir, ec);
  if (!fs::create_directories(tmp_dir, ec))
    return Status::error("cannot create checkpoint directory " + tmp_dir.string() + ": " +
                         ec.message());
  const size_t n = gpt.num_elements();
  json files = json::object();
  RETURN_IF_ERROR(write_data_file(tmp_dir, "params.bin", {{gpt.params(), n}}, &files));
  RETURN_IF_ERROR(write_data_file(tmp_dir, "optim.bin", {{opt.m(), n}, {opt.v(), n}}, &files));
  json index = {{"format", "meshtrain-checkpoint"},
                {"version", kCheckpointFormatVersion},
                {"step", step},
                {"model", model_json(gpt.config())},
                {"tensors", tensors_json(gpt.layout())},
                {"files", files},
                {"optim_layout", "m then v, each in the params layout"},
                {"run_config", run_config}};
  const std::string text = index.dump(1);
  RETURN_IF_ERROR(write_file_synced((tmp_dir / "index.json").string(), text.data(), text.size()));
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) return Status::error("cannot move checkpoint into place at " + final_dir.string());
  RETURN_IF_ERROR(fsync_dir(root.string()));
  remove_old_checkpoints(root, keep);
  return Status::ok();
}

Status find_latest_checkpoint(const std::string& out_dir, std::string* dir) {
  const fs::path root = fs::path(out_dir) / "checkpoints";
  std::string best;
  std::error_code ec;
  if (fs::is_directory(root, ec)) {
    for (auto& e : fs::directory_iterator(root)) {
      auto name = e.path().filename().string();
      if (e.is_directory() && name.starts_with("step_") && !name.ends_with(".tmp") &&
          fs::exists(e.path() / "index.json") && name > fs::path(best).filename().string())
        best = e.path().string();
    }
  }
  if (best.empty()) return Status::error("no checkpoint found under " + root.string());
  *dir = best;
  return Status::ok();
}

Status read_checkpoint_index(const std::string& dir, json* index) {
  std::string text;
  const std::string path = (fs::path(dir) / "index.json").string();
  RETURN_IF_ERROR(read_file(path, &text));
  try {
    *index = json::parse(text);
    if ((*index)["format"] != "meshtrain-checkpoint")
      return Status::error(path + " is not a meshtrain checkpoint index");
    if ((*index)["version"].get<int>() != kCheckpointFormatVersion)
      return Status::error(path + " has checkpoint format version " +
                           (*index)["version"].dump() + ", this build reads version " +
                           std::to_string(kCheckpointFormatVersion));
    (void)(*index)["files"]["params.bin"]["bytes"].get<size_t>();
    (void)(*index)["files"]["optim.bin"]["bytes"].get<size_t>();
    (void)(*index)["step"].get<int64_t>();
  } catch (const std::exception& e) {
    return Status::error(path + " is corrupt: " + e.what());
  }
  return Status::ok();
}

Status checkpoint_model_config(const json& index, model::GptConfig* config) {
  try {
    const json& m = index.at("model");
    config->layers = m.at("layers");
    config->heads = m.at("heads");
    config->dim = m.at("dim");
    config->max_seq_len = m.at("max_seq_len");
    config->vocab = m.at("vocab");
  } catch (const std::exception& e) {
    return Status::error(std::string("checkpoint index has no valid model shape: ") + e.what());
  }
  return model::validate(*config);
}

Status load_checkpoint(const std::string& dir, model::Gpt* gpt, optim::AdamW* opt, int64_t* step) {
  json index;
  RETURN_IF_ERROR(read_checkpoint_index(dir, &index));
  model::GptConfig saved;
  RETURN_IF_ERROR(checkpoint_model_config(index, &saved));
  const auto& c = gpt->config();
  if (saved.layers != c.layers || saved.heads != c.heads || saved.dim != c.dim ||
      saved.max_seq_len != c.max_seq_len || saved.vocab != c.vocab)
    return Status::error(dir + " holds a model of shape " + model_json(saved).dump() +
                         ", but this run's model is " + model_json(c).dump());
  const size_t n = gpt->num_elements();
  std::vector<float> data;
  RETURN_IF_ERROR(read_data_file(dir, index, "params.bin", &data));
  if (data.size() != n) return Status::error(dir + "/params.bin has the wrong element count");
  std::memcpy(gpt->params(), data.data(), n * sizeof(float));
  if (opt) {
    RETURN_IF_ERROR(read_data_file(dir, index, "optim.bin", &data));
    if (data.size() != 2 * n) return Status::error(dir + "/optim.bin has the wrong element count");
    std::memcpy(opt->m(), data.data(), n * sizeof(float));
    std::memcpy(opt->v(), data.data() + n, n * sizeof(float));
  }
  *step = index["step"].get<int64_t>();
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
