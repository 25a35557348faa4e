// Read-only bytes addressed by offset: an open file (positioned reads) or bytes in memory.
// The model-file readers take one, so the same parsing code serves files on disk and the
// fuzz targets (tests/fuzz), which hand over bytes without touching the file system.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace meshtrain::checkpoint {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Exactly `n` bytes at `offset`; reading past the end is an error ("truncated").
  // Safe to call from several threads at once.
  virtual Status read(uint64_t offset, void* dst, size_t n) const = 0;
};

// Opens `path` for reading; the descriptor is closed when the last owner lets go, so a
// file replaced on disk afterwards does not affect the source.
Status open_file_source(const std::string& path, std::shared_ptr<const ByteSource>* out);
std::shared_ptr<const ByteSource> memory_source(std::string bytes);

// Whether the whole of `source` has the checksum `expected_hex` (to_hex(checksum64)), read
// in pieces so that none of it stays in memory; else "`path` is corrupt: checksum mismatch".
Status check_checksum(const ByteSource& source, const std::string& expected_hex, const std::string& path);

}  // namespace meshtrain::checkpoint
