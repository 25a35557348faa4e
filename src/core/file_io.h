// Small file helpers shared by checkpoints and data files.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace meshtrain {

// Loops over short reads and writes (and EINTR) on an open descriptor. A read that hits the
// end of the file first is reported as "truncated".
Status write_all(int fd, const void* data, size_t size);
Status read_exact(int fd, void* data, size_t size);

// Writes bytes to `path` and fsyncs it (no rename: callers stage whole directories).
Status write_file_synced(const std::string& path, const void* data, size_t size);
Status read_file(const std::string& path, std::string* out);
Status fsync_dir(const std::string& dir);
// strerror(errno): why the last failed system call failed, for its error message.
std::string errno_text();

// A fast 64-bit checksum over bytes (8 bytes per round, multiply-xorshift mixing);
// detects corruption, not adversaries.
uint64_t checksum64(const void* data, size_t size, uint64_t seed = 0);
// checksum64 of `size` bytes fed in pieces of any length.
class Checksum64 {
 public:
  explicit Checksum64(size_t size, uint64_t seed = 0);
  void update(const void* data, size_t n);
  uint64_t finish();  // after exactly `size` bytes

 private:
  uint64_t h_;
  unsigned char carry_[8];
  size_t carried_ = 0;
};
std::string to_hex(uint64_t v);

}  // namespace meshtrain
