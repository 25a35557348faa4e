#include "checkpoint/safetensors_model.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/file_io.h"

namespace meshtrain::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_index_path(const std::string& path) { return path.ends_with(".index.json"); }

uint64_t tensor_bytes(const TensorToWrite& t) {
  uint64_t n = sizeof(float);
  for (int64_t d : t.shape) n *= (uint64_t)d;
  return n;
}

// "model-00002-of-00005.safetensors", Hugging Face's shard names.
std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

bool is_weight_file(const std::string& name) {
  return name == "model.safetensors" || name == kHfIndexFile ||
         (name.starts_with("model-") && name.ends_with(".safetensors") && name.find("-of-") != std::string::npos);
}

// The index's weight map, checked for shape: names to plain file names.
Status read_weight_map(const std::string& path, std::map<std::string, std::string>* map, int64_t* total_size) {
  std::string text;
  RETURN_IF_ERROR(read_file(path, &text));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::error(path + ": not a JSON object");
  if (!j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty())
    return Status::error(path + ": no \"weight_map\" object naming each tensor's file");
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) return Status::error(path + ": weight_map[\"" + name + "\"] is not a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      return Status::error(path + ": weight_map[\"" + name + "\"] = \"" + f +
                           "\" is not a file name in the index's folder");
    (*map)[name] = f;
  }
  *total_size = -1;
  if (j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("total_size")) {
    const json& t = j["metadata"]["total_size"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0)
      return Status::error(path + ": metadata.total_size is not a non-negative integer");
    *total_size = t.get<int64_t>();
  }
  return Status::ok();
}

}  // namespace

Status SafetensorsModel::add_file(SafetensorsFile file) {
  const size_t index = files_.size();
  for (const TensorInfo& t : file.tensors()) {
    if (auto it = where_.find(t.name); it != where_.end())
      return Status::error("tensor '" + t.name + "' is in both " + files_[it->second.first].path() + " and " +
                           file.path());
    where_[t.name] = {index, tensors_.size()};
    tensors_.push_back(t);
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

Status SafetensorsModel::open(const std::string& path, SafetensorsModel* out) {
  SafetensorsModel m;
  m.path_ = path;
  if (!is_index_path(path)) {
    SafetensorsFile f;
    RETURN_IF_ERROR(SafetensorsFile::open(path, &f));
    RETURN_IF_ERROR(m.add_file(std::move(f)));
    *out = std::move(m);
    return Status::ok();
  }
  std::map<std::string, std::string> map;
  int64_t total_size = -1;
  RETURN_IF_ERROR(read_weight_map(path, &map, &total_size));
  std::set<std::string> files;
  for (const auto& [name, file] : map) files.insert(file);
  const fs::path folder = fs::path(path).parent_path();
  for (const std::string& file : files) {
    SafetensorsFile f;
    RETURN_IF_ERROR(SafetensorsFile::open((folder / file).string(), &f).with_context(path));
    RETURN_IF_ERROR(m.add_file(std::move(f)).with_context(path));
  }
  uint64_t bytes = 0;
  for (const TensorInfo& t : m.tensors_) {
    auto it = map.find(t.name);
    const std::string& holder = m.files_[m.where_[t.name].first].path();
    if (it == map.end())
      return Status::error(path + ": " + holder + " holds tensor '" + t.name + "', which the weight_map does not list");
    if ((folder / it->second).string() != holder)
      return Status::error(path + ": weight_map puts '" + t.name + "' in " + it->second + ", but it is in " + holder);
    bytes += t.end - t.begin;
  }
  for (const auto& [name, file] : map)
    if (!m.find(name))
      return Status::error(path + ": weight_map lists '" + name + "' in " + file + ", which does not hold it");
  // A shard of the set the map forgot entirely: its tensors would silently be missing.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder.empty() ? fs::path(".") : folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_weight_file(name) && name.starts_with("model-") && !files.count(name))
      return Status::error(path + ": " + name + " is in the folder, but the weight_map names no tensor in it");
  }
  if (total_size >= 0 && (uint64_t)total_size != bytes)
    return Status::error(path + ": metadata.total_size is " + std::to_string(total_size) + " but the shards hold " +
                         std::to_string(bytes) + " bytes of tensors");
  *out = std::move(m);
  return Status::ok();
}

SafetensorsModel SafetensorsModel::single(SafetensorsFile file) {
  SafetensorsModel m;
  m.path_ = file.path();
  (void)m.add_file(std::move(file));  // one file cannot name a tensor twice (its header is checked)
  return m;
}

const TensorInfo* SafetensorsModel::find(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : &tensors_[it->second.second];
}

const std::map<std::string, std::string>& SafetensorsModel::metadata() const {
  static const std::map<std::string, std::string> none;
  return files_.empty() ? none : files_.front().metadata();
}

Status SafetensorsModel::read_float(const std::string& name, float* dst, size_t expected_count) const {
  auto it = where_.find(name);
  if (it == where_.end()) return Status::error(path_ + ": tensor '" + name + "': not found");
  return files_[it->second.first].read_float(name, dst, expected_count);
}

Status write_safetensors_model(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata, double max_shard_bytes) {
  if (!(max_shard_bytes > 0)) return Status::error("the largest shard must be > 0 bytes");
  // Shards in tensor order, each closed when the next tensor would take it past the limit.
  std::vector<std::vector<TensorToWrite>> shards(1);
  double in_shard = 0, total = 0;
  for (const TensorToWrite& t : tensors) {
    const double b = (double)tensor_bytes(t);
    if (!shards.back().empty() && in_shard + b > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(t);
    in_shard += b, total += b;
  }
  std::set<std::string> written;
  if (shards.size() == 1) {
    RETURN_IF_ERROR(write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, metadata));
    written.insert("model.safetensors");
  } else {
    json map = json::object();
    for (size_t i = 0; i < shards.size(); i++) {
      const std::string name = shard_name(i, shards.size());
      RETURN_IF_ERROR(write_safetensors((fs::path(dir) / name).string(), shards[i], metadata));
      for (const TensorToWrite& t : shards[i]) map[t.name] = name;
      written.insert(name);
    }
    const json index = {{"metadata", {{"total_size", (uint64_t)total}}}, {"weight_map", map}};
    const std::string text = index.dump(2) + "\n";
    RETURN_IF_ERROR(write_file_synced((fs::path(dir) / kHfIndexFile).string(), text.data(), text.size()));
    written.insert(kHfIndexFile);
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_weight_file(name) && !written.count(name)) fs::remove(entry.path(), ec);
  }
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
