#include "data/tokenizer_files.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/file_io.h"

namespace meshtrain::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFiles[] = {"encoder.json", "vocab.bpe"};

json file_entry(const std::string& bytes) {
  return {{"bytes", bytes.size()}, {"checksum64", to_hex(checksum64(bytes.data(), bytes.size()))}};
}

std::string path_in(const std::string& dir, const char* name) { return (fs::path(dir) / name).string(); }

}  // namespace

bool has_tokenizer_copy(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(path_in(dir, "manifest.json"), ec);
}

Status save_tokenizer_copy(const std::string& from_dir, const std::string& to_dir) {
  std::error_code ec;
  if (fs::exists(to_dir, ec) && fs::equivalent(from_dir, to_dir, ec)) return verify_tokenizer_copy(to_dir);
  fs::create_directories(to_dir, ec);
  if (ec) return Status::error("cannot create " + to_dir + ": " + ec.message());
  json manifest = {{"format", "gpt2-bpe"}, {"source", fs::absolute(from_dir).lexically_normal().string()}};
  for (const char* name : kFiles) {
    std::string bytes;
    RETURN_IF_ERROR(read_file(path_in(from_dir, name), &bytes).with_context("tokenizer"));
    RETURN_IF_ERROR(write_file_synced(path_in(to_dir, name), bytes.data(), bytes.size()));
    manifest["files"][name] = file_entry(bytes);
  }
  const std::string text = manifest.dump(2) + "\n";
  return write_file_synced(path_in(to_dir, "manifest.json"), text.data(), text.size());
}

Status verify_tokenizer_copy(const std::string& dir, std::string* fingerprint) {
  const std::string manifest_path = path_in(dir, "manifest.json");
  std::string text;
  RETURN_IF_ERROR(read_file(manifest_path, &text));
  const json manifest = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_object())
    return Status::error(manifest_path + ": not a tokenizer manifest (no \"files\" object)");
  std::string fp;
  for (const char* name : kFiles) {
    const json& want = manifest["files"].value(name, json());
    std::string bytes;
    RETURN_IF_ERROR(read_file(path_in(dir, name), &bytes));
    if (want != file_entry(bytes))
      return Status::error(path_in(dir, name) + " does not match " + manifest_path +
                           " (size or checksum differs: the tokenizer copy was changed)");
    fp += std::string(name) + ":" + want["checksum64"].get<std::string>() + " ";
  }
  if (fingerprint) *fingerprint = fp;
  return Status::ok();
}

}  // namespace meshtrain::data
