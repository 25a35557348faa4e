// Token files (.bin). Version 1 is llm.c's format, so datasets prepared by llm.c's scripts
// can be used directly: a header of 256 little-endian int32 (magic 20240520, version 1, token
// count, the rest zero) followed by the tokens as little-endian uint16. Version 2, this
// project's extension for vocabularies over 65,536 ids (Llama 3's 128,256), has the same
// header with version 2 and the tokens as little-endian uint32. The writer uses version 1
// whenever every id fits 16 bits, so llm.c reads what it can.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace meshtrain::data {

using Token = uint32_t;

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion16 = 1;  // llm.c's: uint16 tokens
inline constexpr int32_t kTokenFileVersion32 = 2;  // uint32 tokens
inline constexpr size_t kTokenFileHeaderInts = 256;
inline constexpr size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);

// Bytes per token of a version (2 or 4; 0 for an unknown version).
size_t token_bytes(int32_t version);

// Atomic: writes PATH.tmp, fsyncs it and renames it over PATH. Version 1 when every id is
// below 65,536, else version 2.
Status write_token_file(const std::string& path, std::span<const Token> tokens);

// Validates the header (at least 1024 bytes; magic 20240520, version 1 or 2, a non-negative
// count) and that the file size is exactly header + count tokens of the version's width.
// `tokens` is empty on error.
Status read_token_file(const std::string& path, std::vector<Token>* tokens);
// The same checks on a whole file's bytes in memory (the fuzz target's entry).
Status parse_token_file(std::string_view bytes, std::vector<Token>* tokens);

// A token file mapped read-only, for corpora larger than memory: the same header checks as
// read_token_file, then the tokens are read in place. Movable, not copyable.
class MappedTokenFile {
 public:
  MappedTokenFile() = default;
  MappedTokenFile(MappedTokenFile&& other) noexcept { *this = std::move(other); }
  MappedTokenFile& operator=(MappedTokenFile&& other) noexcept;
  ~MappedTokenFile();

  static Status open(const std::string& path, MappedTokenFile* out);
  uint64_t size() const { return count_; }
  Token at(uint64_t i) const {
    return width_ == 2 ? Token(reinterpret_cast<const uint16_t*>(tokens_)[i]) : reinterpret_cast<const Token*>(tokens_)[i];
  }
  // Tokens [from, from + n) into out.
  void read(uint64_t from, uint64_t n, Token* out) const;
  // The token bytes as stored (what a shard's checksum covers) and their width.
  std::string_view token_bytes_view() const { return {tokens_, count_ * width_}; }
  size_t width() const { return width_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const char* tokens_ = nullptr;
  uint64_t count_ = 0;
  size_t width_ = 2;
};

}  // namespace meshtrain::data
