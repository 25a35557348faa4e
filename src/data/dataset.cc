#include "data/dataset.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/file_io.h"

namespace meshtrain::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string in_dir(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

json shard_json(const ShardEntry& s) {
  json j = {{"file", s.file}, {"tokens", s.tokens}, {"documents", s.documents}, {"max_token", s.max_token},
            {"checksum64", s.checksum}};
  if (!s.docs_file.empty()) j["docs_file"] = s.docs_file, j["docs_checksum64"] = s.docs_checksum;
  return j;
}

// A shard file name must stay inside the dataset folder.
bool plain_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

Status parse_shards(const json& j, const std::string& where, std::vector<ShardEntry>* out) {
  if (!j.is_array()) return Status::error(where + ": \"shards\" is not a list");
  for (size_t i = 0; i < j.size(); i++) {
    const json& e = j[i];
    const std::string at = where + " shard " + std::to_string(i);
    if (!e.is_object() || !e.contains("file") || !e["file"].is_string() || !plain_name(e["file"]))
      return Status::error(at + ": no \"file\" name (a file in the dataset folder)");
    for (const char* key : {"tokens", "documents", "max_token"})
      if (!e.contains(key) || !e[key].is_number_unsigned())
        return Status::error(at + " (" + e["file"].get<std::string>() + "): \"" + key +
                             "\" is not a non-negative integer");
    ShardEntry s;
    s.file = e["file"];
    s.tokens = e["tokens"];
    s.documents = e["documents"];
    s.max_token = e["max_token"];
    s.checksum = e.value("checksum64", "");
    s.docs_file = e.value("docs_file", "");
    s.docs_checksum = e.value("docs_checksum64", "");
    if (!s.docs_file.empty() && !plain_name(s.docs_file))
      return Status::error(at + ": \"docs_file\" must name a file in the dataset folder");
    out->push_back(std::move(s));
  }
  return Status::ok();
}

// llm.c's FineWeb shards: NAME_train_NNNNNN.bin, NAME_val_NNNNNN.bin, in name order.
std::vector<ShardEntry> llmc_shards(const std::string& dir, const std::string& split) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && name.ends_with(".bin") && name.find("_" + split + "_") != std::string::npos)
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  std::vector<ShardEntry> shards;
  for (auto& n : names) shards.push_back({.file = n});
  return shards;
}

uint32_t max_token_of(const MappedTokenFile& f) {
  uint32_t m = 0;
  std::vector<Token> buf(1 << 16);
  for (uint64_t at = 0; at < f.size(); at += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), f.size() - at);
    f.read(at, n, buf.data());
    for (uint64_t i = 0; i < n; i++) m = std::max(m, buf[i]);
  }
  return m;
}

}  // namespace

Status shard_checksum(const std::string& path, std::string* checksum) {
  MappedTokenFile f;
  RETURN_IF_ERROR(MappedTokenFile::open(path, &f));
  const std::string_view bytes = f.token_bytes_view();
  *checksum = to_hex(checksum64(bytes.data(), bytes.size()));
  return Status::ok();
}

Status write_manifest(const std::string& dir, const DatasetManifest& m) {
  json j = {{"format", kManifestFormat},
            {"version", 1},
            {"tokenizer",
             {{"format", m.tokenizer_format},
              {"name", m.tokenizer_name},
              {"fingerprint", m.tokenizer_fingerprint},
              {"vocab_size", m.tokenizer_vocab}}},
            {"shard_tokens", m.shard_tokens}};
  for (const auto& [name, shards] : {std::pair{"train", &m.train}, std::pair{"val", &m.val}}) {
    uint64_t tokens = 0, documents = 0;
    json list = json::array();
    for (const ShardEntry& s : *shards) tokens += s.tokens, documents += s.documents, list.push_back(shard_json(s));
    j["splits"][name] = {{"tokens", tokens}, {"documents", documents}, {"shards", list}};
  }
  const std::string text = j.dump(1) + "\n", path = in_dir(dir, kManifestFile), tmp = path + ".tmp";
  RETURN_IF_ERROR(write_file_synced(tmp, text.data(), text.size()));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::error("rename to " + path + " failed: " + ec.message());
  return Status::ok();
}

Status read_manifest(const std::string& dir, DatasetManifest* m) {
  const std::string path = in_dir(dir, kManifestFile);
  std::string text;
  RETURN_IF_ERROR(read_file(path, &text));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("format", "") != kManifestFormat)
    return Status::error(path + ": not a dataset manifest (\"format\" is not \"" + kManifestFormat + "\")");
  if (j.value("version", 0) != 1)
    return Status::error(path + ": manifest version " + j.value("version", json()).dump() + " is not 1");
  const json tok = j.value("tokenizer", json::object());
  if (!tok.is_object()) return Status::error(path + ": \"tokenizer\" is not an object");
  m->tokenizer_format = tok.value("format", "");
  m->tokenizer_name = tok.value("name", "");
  m->tokenizer_fingerprint = tok.value("fingerprint", "");
  m->tokenizer_vocab = tok.value("vocab_size", 0);
  m->shard_tokens = j.value("shard_tokens", uint64_t(0));
  const json splits = j.value("splits", json::object());
  if (!splits.is_object() || !splits.contains("train"))
    return Status::error(path + ": no \"splits\".\"train\"");
  RETURN_IF_ERROR(parse_shards(splits["train"].value("shards", json()), path + " train", &m->train));
  if (splits.contains("val"))
    RETURN_IF_ERROR(parse_shards(splits["val"].value("shards", json()), path + " val", &m->val));
  return Status::ok();
}

// ---------------------------------------------------------------------------------
// TokenStream

Status TokenStream::open(const std::string& dir, std::vector<ShardEntry> shards, TokenStream* out) {
  TokenStream s;
  s.dir_ = dir;
  for (ShardEntry& e : shards) {
    auto f = std::make_shared<MappedTokenFile>();
    RETURN_IF_ERROR(MappedTokenFile::open(in_dir(dir, e.file), f.get()));
    const bool recorded = e.tokens > 0 || !e.checksum.empty();
    if (recorded && f->size() != e.tokens)
      return Status::error("shard " + in_dir(dir, e.file) + " holds " + std::to_string(f->size()) +
                           " tokens, but the manifest says " + std::to_string(e.tokens));
    e.tokens = f->size();
    s.begins_.push_back(s.total_);
    s.total_ += f->size();
    s.files_.push_back(std::move(f));
  }
  s.entries_ = std::move(shards);
  *out = std::move(s);
  return Status::ok();
}

TokenStream TokenStream::from_tokens(std::vector<Token> tokens) {
  TokenStream s;
  s.total_ = tokens.size();
  s.memory_ = std::move(tokens);
  s.dir_ = "<memory>";
  return s;
}

void TokenStream::read(uint64_t from, uint64_t n, Token* out) const {
  CHECK(from + n <= total_);
  if (files_.empty()) {
    std::copy_n(memory_.begin() + int64_t(from), n, out);
    return;
  }
  // The shard holding `from`: the last whose first token is at or before it.
  size_t k = size_t(std::upper_bound(begins_.begin(), begins_.end(), from) - begins_.begin()) - 1;
  while (n > 0) {
    const uint64_t offset = from - begins_[k], take = std::min<uint64_t>(n, files_[k]->size() - offset);
    files_[k]->read(offset, take, out);
    out += take, from += take, n -= take;
    k++;
  }
}

Status TokenStream::verify(int part, int parts, int vocab) const {
  for (size_t k = size_t(part); k < files_.size(); k += size_t(parts)) {
    const ShardEntry& e = entries_[k];
    const MappedTokenFile& f = *files_[k];
    uint32_t max_token = e.max_token;
    if (!e.checksum.empty()) {
      const std::string_view bytes = f.token_bytes_view();
      const std::string got = to_hex(checksum64(bytes.data(), bytes.size()));
      if (got != e.checksum)
        return Status::error("shard " + f.path() + " is damaged: its checksum is " + got + ", the manifest says " +
                             e.checksum + " (prepare it again, or restore the file)");
    } else {
      max_token = max_token_of(f);
    }
    if (max_token >= uint32_t(vocab))
      return Status::error("shard " + f.path() + " contains token id " + std::to_string(max_token) +
                           ", outside the model's vocabulary of " + std::to_string(vocab));
  }
  return Status::ok();
}

bool TokenStream::has_documents() const {
  return !entries_.empty() && std::all_of(entries_.begin(), entries_.end(),
                                          [](const ShardEntry& e) { return !e.docs_file.empty(); });
}

Status TokenStream::document_starts(uint64_t from, uint64_t to, std::vector<uint64_t>* starts) const {
  starts->clear();
  if (!has_documents()) return Status::ok();
  for (size_t k = 0; k < entries_.size(); k++) {
    const uint64_t begin = begins_[k], end = begin + files_[k]->size();
    if (end <= from || begin >= to) continue;
    const std::string path = in_dir(dir_, entries_[k].docs_file);
    std::string bytes;
    RETURN_IF_ERROR(read_file(path, &bytes));
    if (bytes.size() % sizeof(uint64_t) != 0 || bytes.size() / sizeof(uint64_t) != entries_[k].documents)
      return Status::error(path + ": " + std::to_string(bytes.size()) + " bytes, not the " +
                           std::to_string(entries_[k].documents) + " document offsets the manifest records");
    if (!entries_[k].docs_checksum.empty() &&
        to_hex(checksum64(bytes.data(), bytes.size())) != entries_[k].docs_checksum)
      return Status::error(path + " is damaged: its checksum does not match the manifest");
    for (size_t i = 0; i < bytes.size(); i += sizeof(uint64_t)) {
      uint64_t at;
      std::memcpy(&at, bytes.data() + i, sizeof(at));
      if (at >= from && at < to) starts->push_back(at);
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------
// Datasets

Status open_dataset(const std::string& dir, Dataset* out) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::error("data folder " + dir + " does not exist");
  Dataset d;
  d.dir = dir;
  std::vector<ShardEntry> train, val;
  if (fs::is_regular_file(in_dir(dir, kManifestFile), ec)) {
    DatasetManifest m;
    RETURN_IF_ERROR(read_manifest(dir, &m));
    d.layout = "manifest";
    d.tokenizer_fingerprint = m.tokenizer_fingerprint;
    d.tokenizer_vocab = m.tokenizer_vocab;
    train = std::move(m.train), val = std::move(m.val);
  } else if (fs::is_regular_file(in_dir(dir, "train.bin"), ec)) {
    d.layout = "token-files";
    train = {{.file = "train.bin"}};
    if (fs::is_regular_file(in_dir(dir, "val.bin"), ec)) val = {{.file = "val.bin"}};
  } else {
    d.layout = "llmc-shards";
    train = llmc_shards(dir, "train");
    val = llmc_shards(dir, "val");
  }
  if (train.empty())
    return Status::error("data folder " + dir + " has no training shards (looked for " + kManifestFile +
                         ", train.bin, and llm.c's *_train_*.bin)");
  RETURN_IF_ERROR(TokenStream::open(dir, std::move(train), &d.train));
  if (!val.empty()) {
    RETURN_IF_ERROR(TokenStream::open(dir, std::move(val), &d.val));
    d.has_val = d.val.size() > 0;
  }
  *out = std::move(d);
  return Status::ok();
}

}  // namespace meshtrain::data
