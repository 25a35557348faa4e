// Reading and writing Hugging Face safetensors files.
//
// Layout: an 8-byte little-endian uint64 header length N, N bytes of JSON
//   {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {str: str}}
// and then the data section; offsets are relative to the start of the data section.
// Only the header is kept in memory; tensor data is read on demand with positioned
// reads, because GPT-2 checkpoints run to hundreds of megabytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/byte_source.h"
#include "core/status.h"

namespace meshtrain::checkpoint {

struct TensorInfo {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;  // product(shape) floats, written as F32
};

// Writes fp32 tensors, in the given order, plus an optional "__metadata__" map.
// Atomic: writes PATH.tmp, fsyncs it and renames it over PATH, so a crash never leaves a
// half-written checkpoint under the final name.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

class SafetensorsFile {
 public:
  // Reads and validates the header: the length prefix within the file and at most 100 MiB;
  // the header a JSON object without repeated keys; "__metadata__", if present, an object
  // of strings; every other entry an object with a known "dtype", a "shape" of
  // non-negative integers and "data_offsets" [begin, end] with begin <= end, end - begin =
  // dtype size x elements (no overflow), end within the data section; no two tensors'
  // byte ranges overlapping. The file stays open for later reads, so replacing PATH
  // afterwards (e.g. by a new checkpoint) does not affect this object.
  static Status open(const std::string& path, SafetensorsFile* out);
  // The same for a whole file's bytes in memory; `name` stands for the path in messages.
  static Status from_bytes(std::string bytes, const std::string& name, SafetensorsFile* out);

  const std::string& path() const { return path_; }
  // Sorted by position in the data section.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads tensor NAME into dst as float, converting from F32, F16, BF16 or F64.
  // Errors if the name is missing, the dtype is not a float type, or the element count
  // differs from expected_count. Safe to call from several threads at once.
  Status read_float(const std::string& name, float* dst, size_t expected_count) const;

 private:
  static Status from_source(std::shared_ptr<const ByteSource> source, const std::string& path,
                            SafetensorsFile* out);
  Status parse_header(const std::string& header, uint64_t data_size);
  Status read_bytes(uint64_t data_offset, void* dst, size_t size) const;

  std::string path_;
  std::shared_ptr<const ByteSource> source_;  // shared so the object stays copyable
  uint64_t data_start_ = 0;  // absolute file offset of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// Size in bytes of one element of a safetensors dtype, or 0 if the dtype is unknown.
size_t dtype_size(const std::string& dtype);

}  // namespace meshtrain::checkpoint
