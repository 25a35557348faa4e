#include "core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace meshtrain {

Status write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::error(std::string("write failed: ") + std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::ok();
}

Status read_exact(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::error(std::string("read failed: ") + std::strerror(errno));
    if (n == 0) return Status::error("truncated: unexpected end of file");
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::ok();
}

Status write_file_synced(const std::string& path, const void* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::error("cannot create " + path + ": " + std::strerror(errno));
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      return Status::error("writing " + path + ": " + std::strerror(e));
    }
    p += n;
    left -= (size_t)n;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    return Status::error("syncing " + path + ": " + std::strerror(errno));
  return Status::ok();
}

Status read_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("cannot open " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return Status::ok();
}

std::string errno_text() { return std::strerror(errno); }

Status fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Status::error("cannot open directory " + dir + ": " + std::strerror(errno));
  ::fsync(fd);
  ::close(fd);
  return Status::ok();
}

namespace {
uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  return x;
}
uint64_t absorb(uint64_t h, uint64_t word) { return (h ^ mix(word)) * 0xC4CEB9FE1A85EC53ull; }
}  // namespace

uint64_t checksum64(const void* data, size_t size, uint64_t seed) {
  Checksum64 c(size, seed);
  c.update(data, size);
  return c.finish();
}

Checksum64::Checksum64(size_t size, uint64_t seed) : h_(seed ^ (size * 0x9E3779B97F4A7C15ull)) {}

// Whole 8-byte words in order; a word split between pieces waits in carry_.
void Checksum64::update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  while (n > 0 && (carried_ > 0 || n < 8)) {
    carry_[carried_++] = *p++, n--;
    if (carried_ == 8) {
      uint64_t w;
      std::memcpy(&w, carry_, 8);
      h_ = absorb(h_, w), carried_ = 0;
    }
  }
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h_ = absorb(h_, w);
  }
  while (n > 0) carry_[carried_++] = *p++, n--;
}

uint64_t Checksum64::finish() {
  uint64_t tail = 0;
  std::memcpy(&tail, carry_, carried_);
  return mix(absorb(h_, tail));
}

std::string to_hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

}  // namespace meshtrain
