// A model's weights in safetensors, as Hugging Face stores them: one file
// (model.safetensors), or shards model-0000N-of-0000M.safetensors named by
// model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map":
// {tensor: file}}), which is how every published model past a few GB is distributed.
// Readers see one table of tensors either way.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/status.h"

namespace meshtrain::checkpoint {

inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";

class SafetensorsModel {
 public:
  // A .safetensors file, or an index (a path ending in ".index.json"). An index is checked
  // before any weight is read: a JSON object whose "weight_map" maps tensor names to file
  // names in the index's folder (no path separators); every file it names opens; each
  // tensor is in the file the map names and in no other; no shard holds a tensor the map
  // does not list; "metadata.total_size", when present, equals the shards' tensor bytes.
  static Status open(const std::string& path, SafetensorsModel* out);
  // One file already open (read from memory, for instance).
  static SafetensorsModel single(SafetensorsFile file);

  const std::string& path() const { return path_; }  // the file or the index
  // Every shard's tensors (shard by shard, each by position).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // The first shard's "__metadata__".
  const std::map<std::string, std::string>& metadata() const;
  // As SafetensorsFile::read_float, from the shard that holds the tensor.
  Status read_float(const std::string& name, float* dst, size_t expected_count) const;
  size_t shard_count() const { return files_.size(); }

 private:
  Status add_file(SafetensorsFile file);

  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::pair<size_t, size_t>> where_;  // name -> (file, position in tensors_)
};

// Writes `tensors` (fp32) into `dir` as Hugging Face does: model.safetensors when they fit
// in one shard of `max_shard_bytes`, else shards of at most that size (a tensor larger than
// it alone in its shard) named model-0000N-of-0000M.safetensors and the index. Each file is
// atomic; weight files of an earlier export the new set does not use are then removed, so
// the folder never mixes two exports. `metadata` goes into every shard.
Status write_safetensors_model(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata, double max_shard_bytes);

}  // namespace meshtrain::checkpoint
