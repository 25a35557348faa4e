#include "data/tokenizer_files.h"

#include <cstdint>
#include <cstring>
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

Status write_hf_tokenizer(const std::string& from_dir, const std::string& to_dir) {
  const std::pair<const char*, const char*> renames[] = {{"encoder.json", "vocab.json"}, {"vocab.bpe", "merges.txt"}};
  for (const auto& [from, to] : renames) {
    std::string bytes;
    RETURN_IF_ERROR(read_file(path_in(from_dir, from), &bytes).with_context("tokenizer"));
    RETURN_IF_ERROR(write_file_synced(path_in(to_dir, to), bytes.data(), bytes.size()));
  }
  return Status::ok();
}

Status write_llmc_tokenizer(const Gpt2Tokenizer& tokenizer, const std::string& path) {
  constexpr int32_t kMagic = 20240328, kVersion = 2;
  int32_t header[256] = {kMagic, kVersion, tokenizer.vocab_size(), tokenizer.eot_id()};
  std::string bytes(sizeof(header), '\0');
  std::memcpy(bytes.data(), header, sizeof(header));
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string piece = tokenizer.decode(std::span<const int>(&id, 1));
    if (piece.empty() || piece.size() > 255)
      return Status::error("token " + std::to_string(id) + " has " + std::to_string(piece.size()) +
                           " bytes; llm.c's tokenizer file holds 1 to 255");
    bytes += static_cast<char>(piece.size());
    bytes += piece;
  }
  return write_file_synced(path, bytes.data(), bytes.size());
}

}  // namespace meshtrain::data
