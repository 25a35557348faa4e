// Small file helpers shared by checkpoints and data files.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace meshtrain {

// Writes bytes to `path` and fsyncs it (no rename: callers stage whole directories).
Status write_file_synced(const std::string& path, const void* data, size_t size);
Status read_file(const std::string& path, std::string* out);
Status fsync_dir(const std::string& dir);

// A fast 64-bit checksum over bytes (8 bytes per round, multiply-xorshift mixing);
// detects corruption, not adversaries.
uint64_t checksum64(const void* data, size_t size, uint64_t seed = 0);
std::string to_hex(uint64_t v);

}  // namespace meshtrain
