// A prepared dataset: what `train --data DIR` and `eval --data DIR` read.
//
// Three layouts are read, found by what the folder holds:
// - meshtrain's (manifest.json, written by `prep`): each split ("train", "val") is a list of
//   shards, token files of a set token count (llm.c's format, data/token_file.h), with
//   per-shard token and document counts, the largest token id, a checksum of the shard's
//   tokens, and a .docs file of the split-wide offsets of the documents that start in it.
//   The manifest names the tokenizer that made the tokens (its fingerprint), which train
//   compares with the model's.
// - llm.c's FineWeb layout: *_train_*.bin and *_val_*.bin shards, read as they are, in
//   name order (no checksums or document offsets: nothing to check them against);
// - a bare train.bin (and val.bin), as earlier versions of prep wrote.
//
// A split is one token stream: its shards concatenated, addressed by 64-bit offsets, so a
// corpus of more than 2^32 tokens is one stream. Shards are memory-mapped, not read.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/token_file.h"

namespace meshtrain::data {

inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kManifestFormat = "meshtrain-dataset";

// One shard as the manifest records it (file names relative to the dataset folder).
struct ShardEntry {
  std::string file;
  uint64_t tokens = 0;
  uint64_t documents = 0;       // documents that start in this shard
  uint32_t max_token = 0;
  std::string checksum;         // checksum64 of the stored token bytes, hex; empty: none
  std::string docs_file;        // uint64 little-endian offsets; empty: none
  std::string docs_checksum;
};

// A split's tokens: its shards, concatenated.
class TokenStream {
 public:
  // Maps the shards; each file's token count must equal its entry's (when the entry
  // gives one, i.e. tokens > 0 or a checksum).
  static Status open(const std::string& dir, std::vector<ShardEntry> shards, TokenStream* out);
  static TokenStream from_tokens(std::vector<Token> tokens);

  uint64_t size() const { return total_; }
  // Tokens [from, from + n) into out, across shard boundaries.
  void read(uint64_t from, uint64_t n, Token* out) const;
  // Checks the shards with index % parts == part: the checksum where the manifest has one,
  // and that no token is >= vocab (from the manifest's max_token once the checksum holds,
  // else by reading every token). Errors name the shard file.
  Status verify(int part, int parts, int vocab) const;
  // Offsets of the documents that start in [from, to), from the .docs files; empty when the
  // dataset has none (llm.c shards, bare token files).
  Status document_starts(uint64_t from, uint64_t to, std::vector<uint64_t>* starts) const;
  bool has_documents() const;
  const std::vector<ShardEntry>& shards() const { return entries_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<ShardEntry> entries_;
  std::vector<std::shared_ptr<MappedTokenFile>> files_;
  std::vector<uint64_t> begins_;  // split offset of each shard's first token
  std::vector<Token> memory_;     // from_tokens
  uint64_t total_ = 0;
};

// manifest.json: what prep wrote, and with which tokenizer.
struct DatasetManifest {
  std::string tokenizer_format, tokenizer_name, tokenizer_fingerprint;
  int tokenizer_vocab = 0;
  uint64_t shard_tokens = 0;  // 0: one file per split (train.bin, val.bin)
  std::vector<ShardEntry> train, val;
};
Status write_manifest(const std::string& dir, const DatasetManifest& manifest);
// Errors name the manifest and the field.
Status read_manifest(const std::string& dir, DatasetManifest* manifest);
// The checksum a ShardEntry records for a shard file (of its stored token bytes).
Status shard_checksum(const std::string& path, std::string* checksum);

struct Dataset {
  std::string dir;
  std::string layout;  // "manifest", "llmc-shards", "token-files"
  TokenStream train, val;
  bool has_val = false;
  std::string tokenizer_fingerprint;  // from the manifest; empty when unknown
  int tokenizer_vocab = 0;            // from the manifest; 0 when unknown
};

// Opens a dataset folder (any of the three layouts). An error names the folder and what
// it looked for.
Status open_dataset(const std::string& dir, Dataset* out);

}  // namespace meshtrain::data
