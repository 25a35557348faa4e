// Reads ranges of units out of a checkpoint's shard files, verifying each file's size and
// checksum the first time it is used. A unit is found by its whole-model index in the files
// of the reader's tp rank: any pipeline split and data-parallel size can have written it.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_index.h"
#include "core/status.h"
#include "model/param_layout.h"
#include "parallel/shard_layout.h"

namespace meshtrain::checkpoint {

class ShardReader {
 public:
  // The whole contents of the checkpoint's file `name`.
  using ReadFile = std::function<Status(const std::string& name, std::string* bytes)>;

  // `index` (parse_checkpoint_index's, outliving the reader) describes the model whose
  // whole layout at the reader's tp rank is `whole`. `read` defaults to reading DIR/name.
  ShardReader(std::string dir, const CheckpointIndex& index, const model::ParamLayout& whole, int tp_rank,
              ReadFile read = {});

  // Copies the elements [begin, end) of unit `id` (offsets inside the unit) of `section`
  // (0 params, 1 Adam m, 2 Adam v) into dst.
  Status copy(int section, int id, size_t begin, size_t end, float* dst);

 private:
  size_t owned(int id, int w) const { return writers_.own_end(id, w) - writers_.own_begin(id, w); }
  size_t unit_offset(int f, int id, int w) const;
  size_t section_offset(int section, int f, int w) const { return (size_t)section * unit_offset(f, -1, w); }
  Status open(int f, const std::string** file);

  std::string dir_;
  const CheckpointIndex& index_;
  ReadFile read_;
  WriterLayout writers_;  // the writers' partition of the whole model
  std::map<std::pair<int, int>, int> where_;  // (unit, writer dp rank) -> file
  std::map<int, std::string> files_;          // file -> its verified bytes
};

}  // namespace meshtrain::checkpoint
