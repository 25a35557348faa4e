// llm.c's token file format (.bin), so datasets prepared by llm.c's scripts can be used
// directly: a header of 256 little-endian int32 (magic 20240520, version 1, token count,
// the rest zero) followed by the tokens as little-endian uint16.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace meshtrain::data {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderInts = 256;
inline constexpr size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);

// Atomic: writes PATH.tmp, fsyncs it and renames it over PATH.
Status write_token_file(const std::string& path, std::span<const uint16_t> tokens);

// Validates the header (at least 1024 bytes; magic 20240520, version 1, a non-negative
// count) and that the file size is exactly header + 2 * count. `tokens` is empty on error.
Status read_token_file(const std::string& path, std::vector<uint16_t>* tokens);
// The same checks on a whole file's bytes in memory (the fuzz target's entry).
Status parse_token_file(std::string_view bytes, std::vector<uint16_t>* tokens);

}  // namespace meshtrain::data
