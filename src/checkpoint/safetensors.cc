#include "checkpoint/safetensors.h"

#include "core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace meshtrain::checkpoint {

// The format is little-endian and we move tensor bytes without swapping.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderSize = 100ull << 20;  // same limit as the reference implementation
constexpr const char* kMetadataKey = "__metadata__";

// ---- Writing ---------------------------------------------------------------------------


// Product of the dims, or an error for negative dims or overflow.
Status element_count(const std::vector<int64_t>& shape, uint64_t* count) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return Status::error("negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return Status::error("shape element count overflows");
    }
  }
  *count = n;
  return Status::ok();
}

// Builds the JSON header, space-padded to a multiple of 8 bytes.
Status build_header(const std::vector<TensorToWrite>& tensors,
                    const std::map<std::string, std::string>& metadata, std::string* header) {
  json root = json::object();
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      return Status::error("invalid tensor name '" + t.name + "'");
    }
    if (root.contains(t.name)) return Status::error("duplicate tensor name '" + t.name + "'");
    uint64_t count = 0;
    RETURN_IF_ERROR(element_count(t.shape, &count).with_context("tensor '" + t.name + "'"));
    if (count > 0 && t.data == nullptr) {
      return Status::error("tensor '" + t.name + "' has no data");
    }
    uint64_t bytes = count * sizeof(float);
    root[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) root[kMetadataKey] = metadata;
  *header = root.dump();
  // Padding keeps the data section 8-byte aligned, which lets readers mmap and cast.
  header->append((8 - header->size() % 8) % 8, ' ');
  return Status::ok();
}

Status write_safetensors_contents(int fd, const std::string& header, const std::vector<TensorToWrite>& tensors) {
  uint64_t header_size = header.size();
  RETURN_IF_ERROR(write_all(fd, &header_size, sizeof(header_size)));
  RETURN_IF_ERROR(write_all(fd, header.data(), header.size()));
  for (const TensorToWrite& t : tensors) {
    uint64_t count = 0;
    RETURN_IF_ERROR(element_count(t.shape, &count));
    if (count > 0) RETURN_IF_ERROR(write_all(fd, t.data, count * sizeof(float)));
  }
  if (::fsync(fd) != 0) return Status::error("fsync failed: " + errno_text());
  return Status::ok();
}

// Makes the rename itself durable; failure here is not worth failing the save for.
void fsync_parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// ---- Reading ---------------------------------------------------------------------------

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: shift the mantissa up until it is normalized.
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ff) << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Converts n elements of a non-F32 float dtype from src to dst.
void convert_to_float(const std::string& dtype, const char* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) {
    if (dtype == "F64") {
      double v;
      std::memcpy(&v, src + 8 * i, 8);
      dst[i] = static_cast<float>(v);
    } else {
      uint16_t v;
      std::memcpy(&v, src + 2 * i, 2);
      dst[i] = dtype == "F16" ? half_to_float(v) : bf16_to_float(v);
    }
  }
}

Status parse_shape(const json& j, std::vector<int64_t>* shape) {
  if (!j.is_array()) return Status::error("\"shape\" is not an array");
  for (const json& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return Status::error("\"shape\" has a non-integer or negative dimension");
    }
    shape->push_back(d.get<int64_t>());
  }
  return Status::ok();
}

Status parse_offsets(const json& j, uint64_t* begin, uint64_t* end) {
  if (!j.is_array() || j.size() != 2 || !j[0].is_number_unsigned() || !j[1].is_number_unsigned()) {
    return Status::error("\"data_offsets\" is not a pair of non-negative integers");
  }
  *begin = j[0].get<uint64_t>();
  *end = j[1].get<uint64_t>();
  if (*begin > *end) return Status::error("\"data_offsets\" begin is after end");
  return Status::ok();
}

// Parses one tensor entry and checks it against the data section size.
Status parse_tensor(const std::string& name, const json& j, uint64_t data_size, TensorInfo* info) {
  info->name = name;
  if (!j.is_object()) return Status::error("entry is not an object");
  if (!j.contains("dtype") || !j["dtype"].is_string()) return Status::error("missing \"dtype\"");
  if (!j.contains("shape")) return Status::error("missing \"shape\"");
  if (!j.contains("data_offsets")) return Status::error("missing \"data_offsets\"");
  info->dtype = j["dtype"].get<std::string>();
  size_t elem = dtype_size(info->dtype);
  if (elem == 0) return Status::error("unsupported dtype \"" + info->dtype + "\"");
  RETURN_IF_ERROR(parse_shape(j["shape"], &info->shape));
  RETURN_IF_ERROR(parse_offsets(j["data_offsets"], &info->begin, &info->end));
  uint64_t count = 0, bytes = 0;
  RETURN_IF_ERROR(element_count(info->shape, &count));
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(elem), &bytes) ||
      bytes != info->end - info->begin) {
    return Status::error("data_offsets [" + std::to_string(info->begin) + ", " +
                         std::to_string(info->end) + "] do not match dtype " + info->dtype +
                         " and shape (" + std::to_string(count) + " elements)");
  }
  if (info->end > data_size) {
    // A cut-off download and a corrupt header look the same from here.
    return Status::error("data_offsets [" + std::to_string(info->begin) + ", " +
                         std::to_string(info->end) + "] out of range: data section has only " +
                         std::to_string(data_size) + " bytes (file truncated?)");
  }
  return Status::ok();
}

Status parse_metadata(const json& j, std::map<std::string, std::string>* metadata) {
  if (!j.is_object()) return Status::error("\"__metadata__\" is not an object");
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string())
      return Status::error("\"__metadata__\" value for '" + key + "' is not a string");
    (*metadata)[key] = value.get<std::string>();
  }
  return Status::ok();
}

Status check_no_overlap(const std::vector<TensorInfo>& sorted) {
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].begin < sorted[i - 1].end) {
      return Status::error("tensors '" + sorted[i - 1].name + "' and '" + sorted[i].name +
                           "' overlap in the data section");
    }
  }
  return Status::ok();
}

}  // namespace

size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
      {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::string header;
  RETURN_IF_ERROR(build_header(tensors, metadata, &header).with_context("writing " + path));
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::error("writing " + tmp + ": cannot create: " + errno_text());
  Status status = write_safetensors_contents(fd, header, tensors);
  if (::close(fd) != 0 && status.is_ok()) status = Status::error("close failed: " + errno_text());
  if (status.is_ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = Status::error("rename to " + path + " failed: " + errno_text());
  }
  if (!status.is_ok()) {
    ::unlink(tmp.c_str());
    return status.with_context("writing " + tmp);
  }
  fsync_parent_dir(path);
  return Status::ok();
}

Status SafetensorsFile::open(const std::string& path, SafetensorsFile* out) {
  std::shared_ptr<const ByteSource> source;
  RETURN_IF_ERROR(open_file_source(path, &source).with_context("safetensors file " + path));
  return from_source(std::move(source), path, out);
}

Status SafetensorsFile::from_bytes(std::string bytes, const std::string& name, SafetensorsFile* out) {
  return from_source(memory_source(std::move(bytes)), name, out);
}

Status SafetensorsFile::from_source(std::shared_ptr<const ByteSource> source, const std::string& path,
                                    SafetensorsFile* out) {
  const std::string ctx = "safetensors file " + path;
  const uint64_t file_size = source->size();
  if (file_size < 8) {
    return Status::error(ctx + ": truncated: " + std::to_string(file_size) +
                         " bytes, less than the 8-byte header length");
  }
  uint64_t header_size = 0;
  RETURN_IF_ERROR(source->read(0, &header_size, 8).with_context(ctx));
  if (header_size == 0 || header_size > kMaxHeaderSize) {
    return Status::error(ctx + ": implausible header length " + std::to_string(header_size) +
                         " (not a safetensors file?)");
  }
  if (header_size > file_size - 8) {
    return Status::error(ctx + ": truncated: header length " + std::to_string(header_size) +
                         " but only " + std::to_string(file_size - 8) + " bytes follow");
  }
  std::string header(header_size, '\0');
  RETURN_IF_ERROR(source->read(8, header.data(), header.size()).with_context(ctx));

  SafetensorsFile file;
  file.path_ = path;
  file.source_ = std::move(source);
  file.data_start_ = 8 + header_size;
  RETURN_IF_ERROR(file.parse_header(header, file_size - file.data_start_).with_context(ctx));
  *out = std::move(file);
  return Status::ok();
}

Status SafetensorsFile::parse_header(const std::string& header, uint64_t data_size) {
  // nlohmann keeps the last of repeated keys; a header naming a tensor twice is corrupt,
  // so repeats of the top-level keys are caught while parsing.
  std::set<std::string> keys;
  std::string repeated;
  const auto note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !keys.insert(parsed.get<std::string>()).second &&
        repeated.empty())
      repeated = parsed.get<std::string>();
    return true;
  };
  json root = json::parse(header, note_keys, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::error("header is not valid JSON");
  if (!root.is_object()) return Status::error("header JSON is not an object");
  if (!repeated.empty()) return Status::error("header lists '" + repeated + "' twice");
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      RETURN_IF_ERROR(parse_metadata(value, &metadata_));
      continue;
    }
    TensorInfo info;
    RETURN_IF_ERROR(
        parse_tensor(key, value, data_size, &info).with_context("tensor '" + key + "'"));
    tensors_.push_back(std::move(info));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  RETURN_IF_ERROR(check_no_overlap(tensors_));
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  return Status::ok();
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::read_bytes(uint64_t data_offset, void* dst, size_t size) const {
  if (!source_) return Status::error("file is not open");
  return source_->read(data_start_ + data_offset, dst, size);
}

Status SafetensorsFile::read_float(const std::string& name, float* dst,
                                   size_t expected_count) const {
  const std::string ctx = path_ + ": tensor '" + name + "'";
  const TensorInfo* info = find(name);
  if (info == nullptr) return Status::error(ctx + ": not found");
  const std::string& dtype = info->dtype;
  if (dtype != "F32" && dtype != "F16" && dtype != "BF16" && dtype != "F64") {
    return Status::error(ctx + ": dtype " + dtype + " cannot be read as float");
  }
  const size_t elem = dtype_size(dtype);
  const size_t count = (info->end - info->begin) / elem;
  if (count != expected_count) {
    return Status::error(ctx + ": has " + std::to_string(count) + " elements, expected " +
                         std::to_string(expected_count));
  }
  if (dtype == "F32") return read_bytes(info->begin, dst, count * 4).with_context(ctx);
  // Other dtypes go through a bounded staging buffer rather than a full-size copy.
  constexpr size_t kChunkElems = 1 << 20;
  std::vector<char> buf(std::min(count, kChunkElems) * elem);
  for (size_t done = 0; done < count;) {
    size_t n = std::min(kChunkElems, count - done);
    RETURN_IF_ERROR(read_bytes(info->begin + done * elem, buf.data(), n * elem).with_context(ctx));
    convert_to_float(dtype, buf.data(), n, dst + done);
    done += n;
  }
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
