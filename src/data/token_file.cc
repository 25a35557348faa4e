#include "data/token_file.h"

#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

namespace meshtrain::data {

// Header ints and tokens are stored little-endian and moved without swapping.
static_assert(std::endian::native == std::endian::little, "token files assume little-endian");

namespace {

std::string errno_text() { return std::strerror(errno); }



Status write_contents(int fd, std::span<const uint16_t> tokens) {
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  RETURN_IF_ERROR(write_all(fd, header.data(), kTokenFileHeaderBytes));
  RETURN_IF_ERROR(write_all(fd, tokens.data(), tokens.size_bytes()));
  if (::fsync(fd) != 0) return Status::error("fsync failed: " + errno_text());
  return Status::ok();
}

// Checks the header against the file size; returns the token count.
Status check_header(const std::array<int32_t, kTokenFileHeaderInts>& header, uint64_t file_size,
                    size_t* count) {
  if (header[0] != kTokenFileMagic) {
    return Status::error("bad magic " + std::to_string(header[0]) + ", expected " +
                         std::to_string(kTokenFileMagic) + " (not an llm.c token file?)");
  }
  if (header[1] != kTokenFileVersion) {
    return Status::error("unsupported version " + std::to_string(header[1]) + ", expected " +
                         std::to_string(kTokenFileVersion));
  }
  if (header[2] < 0) return Status::error("negative token count " + std::to_string(header[2]));
  *count = static_cast<size_t>(header[2]);
  const uint64_t expected = kTokenFileHeaderBytes + 2 * static_cast<uint64_t>(*count);
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

Status read_contents(int fd, std::vector<uint16_t>* tokens) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::error("fstat failed: " + errno_text());
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  RETURN_IF_ERROR(check_header_size(file_size));
  std::array<int32_t, kTokenFileHeaderInts> header{};
  RETURN_IF_ERROR(read_exact(fd, header.data(), kTokenFileHeaderBytes));
  size_t count = 0;
  RETURN_IF_ERROR(check_header(header, file_size, &count));
  tokens->resize(count);
  return read_exact(fd, tokens->data(), count * sizeof(uint16_t));
}

}  // namespace

Status write_token_file(const std::string& path, std::span<const uint16_t> tokens) {
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

Status read_token_file(const std::string& path, std::vector<uint16_t>* tokens) {
  tokens->clear();  // callers never see a partial or stale result on error
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error("token file " + path + ": cannot open: " + errno_text());
  Status status = read_contents(fd, tokens);
  ::close(fd);
  if (!status.is_ok()) tokens->clear();
  return status.with_context("token file " + path);
}

Status parse_token_file(std::string_view bytes, std::vector<uint16_t>* tokens) {
  tokens->clear();
  RETURN_IF_ERROR(check_header_size(bytes.size()));
  std::array<int32_t, kTokenFileHeaderInts> header{};
  std::memcpy(header.data(), bytes.data(), kTokenFileHeaderBytes);
  size_t count = 0;
  RETURN_IF_ERROR(check_header(header, bytes.size(), &count));
  tokens->resize(count);
  if (count > 0) std::memcpy(tokens->data(), bytes.data() + kTokenFileHeaderBytes, count * sizeof(uint16_t));
  return Status::ok();
}

}  // namespace meshtrain::data
