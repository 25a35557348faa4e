// llm.c's token file format (.bin), so datasets prepared by llm.c's scripts can be used
// directly: a header of 256 little-endian int32 (magic 20240520, version 1, token count,
// the rest zero) followed by the tokens as little-endian uint16.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace meshtrain::data {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderInts = 256;
inline constexpr size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);

// Atomic: writes PATH.tmp, fsyncs it and renames it over PATH.
Status write_token_file(const std::string& path, std::span<const uint16_t> tokens);

// Validates magic, version and that the file size is exactly header + 2 * count.
Status read_token_file(const std::string& path, std::vector<uint16_t>* tokens);

}  // namespace meshtrain::data
