#include "data/tokenizer.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/bpe.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tiktoken_tokenizer.h"

namespace meshtrain::data {

namespace fs = std::filesystem;

std::vector<int> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<int> ids;
  if (info_.add_bos && info_.bos_id >= 0) ids.push_back(info_.bos_id);
  const std::vector<int> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (info_.add_eos && info_.eos_id >= 0) ids.push_back(info_.eos_id);
  return ids;
}

std::vector<int> Tokenizer::encode_document(std::string_view text) const {
  const bool own_bos = info_.bos_id >= 0 && info_.bos_id != info_.eos_id;
  std::vector<int> ids;
  if (own_bos) {
    ids.push_back(info_.bos_id);
  } else if (document_separator() >= 0) {
    ids.push_back(document_separator());
  }
  const std::vector<int> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (own_bos && info_.eos_id >= 0) ids.push_back(info_.eos_id);
  return ids;
}

std::string Tokenizer::decode(std::span<const int> ids) const {
  std::string out;
  for (int id : ids) {
    CHECK_MSG(id >= 0 && id < vocab_size(), "token id out of range in Tokenizer::decode");
    out += token_bytes(id);
  }
  if (info_.strip_leading_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

Status Tokenizer::decode_checked(std::span<const int> ids, std::string* out) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return Status::error("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                           " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
    }
  }
  *out = decode(ids);
  return Status::ok();
}

namespace {

// Each format's detection is one small function, tried in load_tokenizer's order.
bool hf_json_in(const std::string& path) { return HfTokenizer::files_in(path); }
bool tiktoken_in(const std::string& path) { return !TiktokenTokenizer::rank_file_in(path).empty(); }

template <typename T>
Status load_as(const std::string& path, std::unique_ptr<Tokenizer>* out) {
  auto tok = std::make_unique<T>();
  RETURN_IF_ERROR(T::load(path, tok.get()));
  *out = std::move(tok);
  return Status::ok();
}

// A SentencePiece model at `path` (SentencePieceTokenizer::model_file_in): loaded into *out.
// False when `path` names none.
bool load_sentencepiece(const std::string& path, std::unique_ptr<Tokenizer>* out, Status* status) {
  const std::string file = SentencePieceTokenizer::model_file_in(path);
  if (file.empty()) return false;
  auto tok = std::make_unique<SentencePieceTokenizer>();
  *status = SentencePieceTokenizer::load(file, tok.get());
  if (status->is_ok()) *out = std::move(tok);
  return true;
}

// A tokenizer copy (tokenizer_files.h) of one file keeps that file's own name (x.model,
// cl100k_base.tiktoken): its manifest.json names it. The folder itself otherwise.
std::string single_file_of_copy(const std::string& path) {
  std::error_code ec;
  const fs::path manifest = fs::path(path) / "manifest.json";
  if (!fs::is_regular_file(manifest, ec)) return path;
  std::ifstream in(manifest);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("files") || !j["files"].is_object() || j["files"].size() != 1) return path;
  const std::string name = j["files"].begin().key();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") return path;
  return (fs::path(path) / name).string();
}

}  // namespace

bool tokenizer_files_in(const std::string& given) {
  const std::string path = single_file_of_copy(given);
  return hf_json_in(path) || tiktoken_in(path) || !SentencePieceTokenizer::model_file_in(path).empty() ||
         Gpt2Tokenizer::files_in(path);
}

Status load_tokenizer(const std::string& given, std::unique_ptr<Tokenizer>* out) {
  std::error_code ec;
  if (!fs::exists(given, ec)) return Status::error("tokenizer directory or file " + given + " does not exist");
  const std::string path = single_file_of_copy(given);
  if (hf_json_in(path)) return load_as<HfTokenizer>(path, out);
  if (tiktoken_in(path)) return load_as<TiktokenTokenizer>(path, out);
  if (Status s = Status::ok(); load_sentencepiece(path, out, &s)) return s;
  if (Gpt2Tokenizer::files_in(path)) return load_as<Gpt2Tokenizer>(path, out);
  return Status::error("no tokenizer found at " + path +
                       " (looked for tokenizer.json, tokenizer.model, *.tiktoken, encoder.json + vocab.bpe, "
                       "vocab.json + merges.txt)");
}

}  // namespace meshtrain::data
