#include "checkpoint/shard_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/file_io.h"

namespace meshtrain::checkpoint {

ShardReader::ShardReader(std::string dir, const CheckpointIndex& index, const model::ParamLayout& whole,
                         int tp_rank, OpenFile open)
    : dir_(std::move(dir)), index_(index), open_(std::move(open)), writers_(whole, index.dp_size, index.ep_size) {
  CHECK_MSG(writers_.units().size() == (size_t)whole.num_units(), "ShardReader: a layout of another model");
  if (!open_)
    open_ = [dir = dir_](const std::string& name, std::shared_ptr<const ByteSource>* file) {
      return open_file_source((std::filesystem::path(dir) / name).string(), file);
    };
  for (size_t f = 0; f < index.files.size(); f++) {
    if (index.files[f].tp != tp_rank) continue;
    for (int u : index.files[f].units) where_.emplace(std::pair{u, index.files[f].dp}, (int)f);  // first copy wins
  }
}

Status ShardReader::copy(int section, int id, size_t begin, size_t end, float* dst) {
  const size_t base = writers_.units()[id].global_offset;
  for (int w = 0; w < writers_.world(); w++) {
    const size_t own_a = writers_.own_begin(id, w) - base, own_b = writers_.own_end(id, w) - base;
    const size_t a = std::max(begin, own_a), b = std::min(end, own_b);
    if (a >= b) continue;
    auto it = where_.find({id, w});
    if (it == where_.end())
      return Status::error(dir_ + ": no shard file holds unit " + std::to_string(id) + " of data-parallel rank " +
                           std::to_string(w));
    const ByteSource* file = nullptr;
    RETURN_IF_ERROR(open(it->second, &file));
    const size_t at = section_offset(section, it->second, w) + unit_offset(it->second, id, w) + (a - own_a);
    RETURN_IF_ERROR(file->read(at * sizeof(float), dst + (a - begin), (b - a) * sizeof(float)));
  }
  return Status::ok();
}

// Where unit `id` starts in a section of file f (written by dp rank w): after the file's
// earlier units.
size_t ShardReader::unit_offset(int f, int id, int w) const {
  size_t at = 0;
  for (int u : index_.files[f].units) {
    if (u == id) return at;
    at += owned(u, w);
  }
  return at;  // past the end: the section size
}

Status ShardReader::open(int f, const ByteSource** file) {
  auto it = files_.find(f);
  if (it == files_.end()) {
    const IndexFile& meta = index_.files[f];
    const std::string path = (std::filesystem::path(dir_) / meta.name).string();
    std::shared_ptr<const ByteSource> source;
    RETURN_IF_ERROR(open_(meta.name, &source));
    if (source->size() != meta.bytes || meta.bytes != section_offset(index_.sections, f, meta.dp) * sizeof(float))
      return Status::error(path + " is truncated or has the wrong size (" + std::to_string(source->size()) +
                           " bytes, index says " + std::to_string(meta.bytes) + ")");
    RETURN_IF_ERROR(check_checksum(*source, meta.checksum, path));
    it = files_.emplace(f, std::move(source)).first;
  }
  *file = it->second.get();
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
