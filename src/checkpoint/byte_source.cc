#include "checkpoint/byte_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/file_io.h"

namespace meshtrain::checkpoint {

namespace {

Status out_of_range(uint64_t offset, size_t n, uint64_t size) {
  return Status::error("truncated: " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                       " run past the end (" + std::to_string(size) + " bytes)");
}

bool fits(uint64_t offset, size_t n, uint64_t size) { return offset <= size && n <= size - offset; }

class FileSource : public ByteSource {
 public:
  FileSource(int fd, uint64_t size) : fd_(fd), size_(size) {}
  ~FileSource() override { ::close(fd_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  uint64_t size() const override { return size_; }
  Status read(uint64_t offset, void* dst, size_t n) const override {
    if (!fits(offset, n, size_)) return out_of_range(offset, n, size_);
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return Status::error("read failed: " + errno_text());
      if (got == 0) return Status::error("unexpected end of file (truncated)");  // shrunk since open
      p += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
    return Status::ok();
  }

 private:
  int fd_;
  uint64_t size_;
};

class MemorySource : public ByteSource {
 public:
  explicit MemorySource(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  Status read(uint64_t offset, void* dst, size_t n) const override {
    if (!fits(offset, n, bytes_.size())) return out_of_range(offset, n, bytes_.size());
    if (n > 0) std::memcpy(dst, bytes_.data() + offset, n);
    return Status::ok();
  }

 private:
  std::string bytes_;
};

}  // namespace

Status open_file_source(const std::string& path, std::shared_ptr<const ByteSource>* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error("cannot open: " + errno_text());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    return Status::error("fstat failed: " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error("not a regular file");
  }
  *out = std::make_shared<const FileSource>(fd, static_cast<uint64_t>(st.st_size));
  return Status::ok();
}

std::shared_ptr<const ByteSource> memory_source(std::string bytes) {
  return std::make_shared<const MemorySource>(std::move(bytes));
}

Status check_checksum(const ByteSource& source, const std::string& expected_hex, const std::string& path) {
  constexpr size_t kPiece = 4 << 20;
  std::string piece(std::min<uint64_t>(kPiece, source.size()), '\0');
  Checksum64 sum(source.size());
  for (uint64_t at = 0; at < source.size(); at += kPiece) {
    const size_t n = (size_t)std::min<uint64_t>(kPiece, source.size() - at);
    RETURN_IF_ERROR(source.read(at, piece.data(), n));
    sum.update(piece.data(), n);
  }
  if (to_hex(sum.finish()) != expected_hex) return Status::error(path + " is corrupt: checksum mismatch");
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
