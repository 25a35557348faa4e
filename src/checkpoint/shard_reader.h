// Reads ranges of units out of a checkpoint's shard files, verifying each file's size and
// checksum the first time it is used. A unit is found by its whole-model index in the files
// of the reader's tp rank: any pipeline split and data-parallel size can have written it.
// Files are read by position, only the ranges asked for (the checksum streams through a file
// once in pieces): a reader of the parameters alone never holds a file's moments in memory.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/byte_source.h"
#include "checkpoint/checkpoint_index.h"
#include "core/status.h"
#include "model/param_layout.h"
#include "parallel/shard_layout.h"

namespace meshtrain::checkpoint {

class ShardReader {
 public:
  // The checkpoint's file `name`, opened.
  using OpenFile = std::function<Status(const std::string& name, std::shared_ptr<const ByteSource>* file)>;

  // `index` (parse_checkpoint_index's, outliving the reader) describes the model whose
  // whole layout at the reader's tp rank is `whole`. `open` defaults to opening DIR/name.
  ShardReader(std::string dir, const CheckpointIndex& index, const model::ParamLayout& whole, int tp_rank,
              OpenFile open = {});

  // Copies the elements [begin, end) of unit `id` (offsets inside the unit) of `section`
  // (0 params, 1 Adam m, 2 Adam v, 3 the previous weight version) into dst.
  Status copy(int section, int id, size_t begin, size_t end, float* dst);

 private:
  size_t owned(int id, int w) const { return writers_.own_end(id, w) - writers_.own_begin(id, w); }
  size_t unit_offset(int f, int id, int w) const;
  size_t section_offset(int section, int f, int w) const { return (size_t)section * unit_offset(f, -1, w); }
  Status open(int f, const ByteSource** file);

  std::string dir_;
  const CheckpointIndex& index_;
  OpenFile open_;
  WriterLayout writers_;  // the writers' partition of the whole model
  std::map<std::pair<int, int>, int> where_;  // (unit, writer dp rank) -> file
  std::map<int, std::shared_ptr<const ByteSource>> files_;  // file -> its verified contents
};

}  // namespace meshtrain::checkpoint
