#include "data/token_file.h"

#include "core/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

namespace meshtrain::data {

// Header ints and tokens are stored little-endian and moved without swapping.
static_assert(std::endian::native == std::endian::little, "token files assume little-endian");

namespace {

std::string errno_text() { return std::strerror(errno); }



int32_t version_for(std::span<const Token> tokens) {
  for (Token t : tokens)
    if (t > 0xFFFF) return kTokenFileVersion32;
  return kTokenFileVersion16;
}

Status write_contents(int fd, std::span<const Token> tokens) {
  const int32_t version = version_for(tokens);
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = kTokenFileMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  RETURN_IF_ERROR(write_all(fd, header.data(), kTokenFileHeaderBytes));
  if (version == kTokenFileVersion32) {
    RETURN_IF_ERROR(write_all(fd, tokens.data(), tokens.size_bytes()));
  } else {
    // Narrowed in pieces, so a large file never needs a second full copy.
    std::vector<uint16_t> narrow;
    for (size_t at = 0; at < tokens.size(); at += narrow.size()) {
      narrow.assign(tokens.begin() + at, tokens.begin() + std::min(tokens.size(), at + (size_t)(1 << 20)));
      RETURN_IF_ERROR(write_all(fd, narrow.data(), narrow.size() * sizeof(uint16_t)));
    }
  }
  if (::fsync(fd) != 0) return Status::error("fsync failed: " + errno_text());
  return Status::ok();
}

// Checks the header against the file size; returns the token count and width.
Status check_header(const std::array<int32_t, kTokenFileHeaderInts>& header, uint64_t file_size,
                    size_t* count, size_t* width) {
  if (header[0] != kTokenFileMagic) {
    return Status::error("bad magic " + std::to_string(header[0]) + ", expected " +
                         std::to_string(kTokenFileMagic) + " (not an llm.c token file?)");
  }
  *width = token_bytes(header[1]);
  if (*width == 0) {
    return Status::error("unsupported version " + std::to_string(header[1]) + ", expected " +
                         std::to_string(kTokenFileVersion16) + " (uint16 tokens, llm.c's) or " +
                         std::to_string(kTokenFileVersion32) + " (uint32 tokens)");
  }
  if (header[2] < 0) return Status::error("negative token count " + std::to_string(header[2]));
  *count = static_cast<size_t>(header[2]);
  const uint64_t expected = kTokenFileHeaderBytes + *width * static_cast<uint64_t>(*count);
  if (file_size < expected) {
    return Status::error("truncated: header says " + std::to_string(*count) + " tokens (" +
                         std::to_string(expected) + " bytes) but file has " +
                         std::to_string(file_size) + " bytes");
  }
  if (file_size > expected) {
    return Status::error("file has " + std::to_string(file_size) + " bytes, expected " +
                         std::to_string(expected) + " for " + std::to_string(*count) +
                         " tokens (trailing data)");
  }
  return Status::ok();
}

Status check_header_size(uint64_t file_size) {
  if (file_size >= kTokenFileHeaderBytes) return Status::ok();
  return Status::error("truncated: " + std::to_string(file_size) + " bytes, less than the " +
                       std::to_string(kTokenFileHeaderBytes) + "-byte header");
}

// `count` tokens of `width` bytes from `bytes` into `tokens`.
void widen(const char* bytes, size_t count, size_t width, std::vector<Token>* tokens) {
  tokens->resize(count);
  if (width == sizeof(Token)) {
    if (count > 0) std::memcpy(tokens->data(), bytes, count * width);
    return;
  }
  for (size_t i = 0; i < count; i++) {
    uint16_t t;
    std::memcpy(&t, bytes + i * width, width);
    (*tokens)[i] = t;
  }
}

Status read_contents(int fd, std::vector<Token>* tokens) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::error("fstat failed: " + errno_text());
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  RETURN_IF_ERROR(check_header_size(file_size));
  std::array<int32_t, kTokenFileHeaderInts> header{};
  RETURN_IF_ERROR(read_exact(fd, header.data(), kTokenFileHeaderBytes));
  size_t count = 0, width = 0;
  RETURN_IF_ERROR(check_header(header, file_size, &count, &width));
  std::vector<char> bytes(count * width);
  RETURN_IF_ERROR(read_exact(fd, bytes.data(), bytes.size()));
  widen(bytes.data(), count, width, tokens);
  return Status::ok();
}

}  // namespace

size_t token_bytes(int32_t version) {
  return version == kTokenFileVersion16 ? sizeof(uint16_t) : version == kTokenFileVersion32 ? sizeof(uint32_t) : 0;
}

Status write_token_file(const std::string& path, std::span<const Token> tokens) {
  // The count lives in an int32 slot of the header.
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::error("writing " + path + ": " + std::to_string(tokens.size()) +
                         " tokens do not fit the header's int32 count");
  }
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::error("writing " + tmp + ": cannot create: " + errno_text());
  Status status = write_contents(fd, tokens);
  if (::close(fd) != 0 && status.is_ok()) status = Status::error("close failed: " + errno_text());
  if (status.is_ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = Status::error("rename to " + path + " failed: " + errno_text());
  }
  if (!status.is_ok()) ::unlink(tmp.c_str());
  return status.with_context("writing " + tmp);
}

Status read_token_file(const std::string& path, std::vector<Token>* tokens) {
  tokens->clear();  // callers never see a partial or stale result on error
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error("token file " + path + ": cannot open: " + errno_text());
  Status status = read_contents(fd, tokens);
  ::close(fd);
  if (!status.is_ok()) tokens->clear();
  return status.with_context("token file " + path);
}

Status parse_token_file(std::string_view bytes, std::vector<Token>* tokens) {
  tokens->clear();
  RETURN_IF_ERROR(check_header_size(bytes.size()));
  std::array<int32_t, kTokenFileHeaderInts> header{};
  std::memcpy(header.data(), bytes.data(), kTokenFileHeaderBytes);
  size_t count = 0, width = 0;
  RETURN_IF_ERROR(check_header(header, bytes.size(), &count, &width));
  widen(bytes.data() + kTokenFileHeaderBytes, count, width, tokens);
  return Status::ok();
}

MappedTokenFile& MappedTokenFile::operator=(MappedTokenFile&& other) noexcept {
  if (this != &other) {
    this->~MappedTokenFile();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
    width_ = other.width_;
  }
  return *this;
}

MappedTokenFile::~MappedTokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
}

Status MappedTokenFile::open(const std::string& path, MappedTokenFile* out) {
  MappedTokenFile file;
  file.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error("token file " + path + ": cannot open: " + errno_text());
  struct stat st;
  Status status = ::fstat(fd, &st) == 0 ? check_header_size(uint64_t(st.st_size))
                                        : Status::error("fstat failed: " + errno_text());
  std::array<int32_t, kTokenFileHeaderInts> header{};
  if (status.is_ok()) status = read_exact(fd, header.data(), kTokenFileHeaderBytes);
  size_t count = 0;
  if (status.is_ok()) status = check_header(header, uint64_t(st.st_size), &count, &file.width_);
  if (status.is_ok()) {
    file.map_bytes_ = size_t(st.st_size);
    file.map_ = ::mmap(nullptr, file.map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
    if (file.map_ == MAP_FAILED) {
      file.map_ = nullptr;
      status = Status::error("mmap failed: " + errno_text());
    }
  }
  ::close(fd);
  if (!status.is_ok()) return status.with_context("token file " + path);
  file.count_ = count;
  file.tokens_ = static_cast<const char*>(file.map_) + kTokenFileHeaderBytes;
  *out = std::move(file);
  return Status::ok();
}

void MappedTokenFile::read(uint64_t from, uint64_t n, Token* out) const {
  if (width_ == sizeof(Token)) {
    std::memcpy(out, tokens_ + from * width_, n * width_);
    return;
  }
  const uint16_t* narrow = reinterpret_cast<const uint16_t*>(tokens_) + from;
  for (uint64_t i = 0; i < n; i++) out[i] = narrow[i];
}

}  // namespace meshtrain::data
