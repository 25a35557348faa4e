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

}  // namespace meshtrain::data
