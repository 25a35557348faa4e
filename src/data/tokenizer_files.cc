#include "data/tokenizer_files.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/file_io.h"

namespace meshtrain::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json file_entry(const std::string& bytes) {
  return {{"bytes", bytes.size()}, {"checksum64", to_hex(checksum64(bytes.data(), bytes.size()))}};
}

std::string path_in(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// A name a manifest may list: a plain file name, never a path out of the folder.
bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos;
}

Status read_manifest(const std::string& dir, json* manifest) {
  const std::string manifest_path = path_in(dir, "manifest.json");
  std::string text;
  RETURN_IF_ERROR(read_file(manifest_path, &text));
  *manifest = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!manifest->is_object() || !manifest->contains("files") || !(*manifest)["files"].is_object() ||
      (*manifest)["files"].empty())
    return Status::error(manifest_path + ": not a tokenizer manifest (no \"files\" object naming its files)");
  for (const auto& [name, entry] : (*manifest)["files"].items())
    if (!plain_name(name) || !entry.is_object() || !entry.contains("checksum64") || !entry["checksum64"].is_string())
      return Status::error(manifest_path + ": file entry '" + name + "' is not a file name with a size and checksum");
  return Status::ok();
}

// Writes each (name, bytes) into to_dir and the manifest after them: a copy is whole once its
// manifest is there.
Status write_copy(const std::vector<std::pair<std::string, std::string>>& files, json manifest,
                  const std::string& to_dir) {
  std::error_code ec;
  fs::create_directories(to_dir, ec);
  if (ec) return Status::error("cannot create " + to_dir + ": " + ec.message());
  // The files of a copy this one replaces go first, so that no other tokenizer's file is left
  // beside the new one's.
  json old;
  if (has_tokenizer_copy(to_dir) && read_manifest(to_dir, &old).is_ok()) {
    fs::remove(path_in(to_dir, "manifest.json"), ec);
    for (const auto& [name, entry] : old["files"].items()) {
      bool kept = false;
      for (const auto& f : files) kept = kept || f.first == name;
      if (!kept) fs::remove(path_in(to_dir, name), ec);
    }
  }
  manifest["files"] = json::object();
  for (const auto& [name, bytes] : files) {
    RETURN_IF_ERROR(write_file_synced(path_in(to_dir, name), bytes.data(), bytes.size()));
    manifest["files"][name] = file_entry(bytes);
  }
  const std::string text = manifest.dump(2) + "\n";
  return write_file_synced(path_in(to_dir, "manifest.json"), text.data(), text.size());
}

}  // namespace

bool has_tokenizer_copy(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(path_in(dir, "manifest.json"), ec);
}

Status save_tokenizer_copy(const Tokenizer& tokenizer, const std::string& to_dir) {
  if (tokenizer.source_files().empty())
    return Status::error("tokenizer " + tokenizer.info().name + " names no files to copy");
  std::vector<std::pair<std::string, std::string>> files;
  for (const std::string& path : tokenizer.source_files()) {
    const std::string name = fs::path(path).filename().string();
    for (const auto& f : files)
      if (f.first == name) return Status::error("tokenizer files " + path + " and another share the name " + name);
    std::string bytes;
    RETURN_IF_ERROR(read_file(path, &bytes).with_context("tokenizer"));
    files.emplace_back(name, std::move(bytes));
  }
  const TokenizerInfo& info = tokenizer.info();
  json manifest = {{"format", info.format},
                   {"name", info.name},
                   {"vocab_size", tokenizer.vocab_size()},
                   {"source", files.size() == 1 ? tokenizer.source_files()[0]
                                                : fs::path(tokenizer.source_files()[0]).parent_path().string()}};
  // A tokenizer loaded from the very copy it would be saved to: that copy stays as it is.
  std::error_code ec;
  const std::string from_dir = fs::path(tokenizer.source_files()[0]).parent_path().string();
  if (has_tokenizer_copy(to_dir) && fs::equivalent(from_dir, to_dir, ec)) return verify_tokenizer_copy(to_dir);
  return write_copy(files, manifest, to_dir);
}

Status save_tokenizer_copy(const std::string& from, const std::string& to_dir) {
  std::error_code ec;
  if (has_tokenizer_copy(from)) {
    if (fs::exists(to_dir, ec) && fs::equivalent(from, to_dir, ec)) return verify_tokenizer_copy(to_dir);
    RETURN_IF_ERROR(verify_tokenizer_copy(from));
    json manifest;
    RETURN_IF_ERROR(read_manifest(from, &manifest));
    std::vector<std::pair<std::string, std::string>> files;
    for (const auto& [name, entry] : manifest["files"].items()) {
      std::string bytes;
      RETURN_IF_ERROR(read_file(path_in(from, name), &bytes));
      files.emplace_back(name, std::move(bytes));
    }
    manifest["source"] = fs::absolute(from).lexically_normal().string();
    return write_copy(files, manifest, to_dir);
  }
  std::unique_ptr<Tokenizer> tok;
  RETURN_IF_ERROR(load_tokenizer(from, &tok));
  return save_tokenizer_copy(*tok, to_dir);
}

Status verify_tokenizer_copy(const std::string& dir, std::string* fingerprint) {
  json manifest;
  RETURN_IF_ERROR(read_manifest(dir, &manifest));
  const std::string manifest_path = path_in(dir, "manifest.json");
  std::string fp;
  for (const auto& [name, want] : manifest["files"].items()) {  // (in name order)
    std::string bytes;
    RETURN_IF_ERROR(read_file(path_in(dir, name), &bytes));
    if (want != file_entry(bytes))
      return Status::error(path_in(dir, name) + " does not match " + manifest_path +
                           " (size or checksum differs: the tokenizer copy was changed)");
    fp += name + ":" + want["checksum64"].get<std::string>() + " ";
  }
  if (fingerprint) *fingerprint = fp;
  return Status::ok();
}

Status tokenizer_fingerprint(const Tokenizer& tokenizer, std::string* fingerprint) {
  std::vector<std::string> paths = tokenizer.source_files();
  std::sort(paths.begin(), paths.end(), [](const std::string& a, const std::string& b) {
    return fs::path(a).filename() < fs::path(b).filename();
  });
  fingerprint->clear();
  for (const std::string& path : paths) {
    std::string bytes;
    RETURN_IF_ERROR(read_file(path, &bytes));
    *fingerprint += fs::path(path).filename().string() + ":" + file_entry(bytes)["checksum64"].get<std::string>() + " ";
  }
  return Status::ok();
}

bool same_tokenizer(const std::string& a, const std::string& b) {
  // "name:checksum name:checksum ": the checksums, in order.
  auto checksums = [](const std::string& fp) {
    std::vector<std::string> out;
    std::istringstream words(fp);
    for (std::string w; words >> w;) out.push_back(w.substr(w.rfind(':') + 1));
    std::sort(out.begin(), out.end());
    return out;
  };
  return checksums(a) == checksums(b);
}

Status tokenizer_copy_vocab(const std::string& dir, int* vocab_size) {
  RETURN_IF_ERROR(verify_tokenizer_copy(dir));
  json manifest;
  RETURN_IF_ERROR(read_manifest(dir, &manifest));
  if (manifest.contains("vocab_size") && manifest["vocab_size"].is_number_integer()) {
    *vocab_size = manifest["vocab_size"].get<int>();
    return Status::ok();
  }
  std::unique_ptr<Tokenizer> tok;
  RETURN_IF_ERROR(load_tokenizer(dir, &tok));
  *vocab_size = tok->vocab_size();
  return Status::ok();
}

Status write_hf_tokenizer(const Tokenizer& tokenizer, const std::string& to_dir, std::vector<std::string>* written) {
  const std::vector<std::string>& sources = tokenizer.source_files();
  const std::string& format = tokenizer.info().format;
  std::vector<std::pair<std::string, std::string>> copies;  // (from, to name)
  if (format == "gpt2-bpe" && sources.size() == 2) {
    copies = {{sources[0], "vocab.json"}, {sources[1], "merges.txt"}};
  } else if (format == "sentencepiece" && sources.size() == 1) {
    copies = {{sources[0], "tokenizer.model"}};
  } else {
    for (const std::string& s : sources) copies.emplace_back(s, fs::path(s).filename().string());
  }
  if (copies.empty()) return Status::error("tokenizer " + tokenizer.info().name + " names no files to export");
  written->clear();
  for (const auto& [from, to] : copies) {
    std::string bytes;
    RETURN_IF_ERROR(read_file(from, &bytes).with_context("tokenizer"));
    RETURN_IF_ERROR(write_file_synced(path_in(to_dir, to), bytes.data(), bytes.size()));
    written->push_back(to);
  }
  return Status::ok();
}

std::string llmc_tokenizer_unsupported(const Tokenizer& tokenizer) {
  const TokenizerInfo& info = tokenizer.info();
  if (info.format == "sentencepiece" || info.strip_leading_space)
    return "llm.c's table is each token's bytes joined, and " + info.format +
           " text is not: its decoder drops the space it prepends at the start of a text";
  if (info.eos_id < 0) return "llm.c's table needs an end-of-text token, and " + info.name + " has none";
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    const size_t n = tokenizer.token_bytes(id).size();
    if (n == 0 || n > 255)
      return "token " + std::to_string(id) + " has " + std::to_string(n) +
             " bytes; llm.c's tokenizer file holds 1 to 255";
  }
  return "";
}

Status write_llmc_tokenizer(const Tokenizer& tokenizer, const std::string& path) {
  if (const std::string why = llmc_tokenizer_unsupported(tokenizer); !why.empty())
    return Status::error("no llm.c tokenizer file for " + tokenizer.info().name + " (" + tokenizer.info().format +
                         "): " + why);
  constexpr int32_t kMagic = 20240328, kVersion = 2;
  int32_t header[256] = {kMagic, kVersion, tokenizer.vocab_size(), tokenizer.info().eos_id};
  std::string bytes(sizeof(header), '\0');
  std::memcpy(bytes.data(), header, sizeof(header));
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string_view piece = tokenizer.token_bytes(id);
    bytes += static_cast<char>(piece.size());
    bytes += piece;
  }
  return write_file_synced(path, bytes.data(), bytes.size());
}

}  // namespace meshtrain::data
