// Reads a checkpoint's units for a rank of any tensor-parallel size: the universal
// checkpoint. When the writers' tp size and expert layout equal the reader's, ranges come
// straight out of the shard files of the reader's tp rank. Otherwise each unit is
// reassembled whole from every writer tp rank's slice (model::local_to_global), then cut to
// the reader's slice (model::global_to_local). Parameters and both Adam moments are
// elementwise over the same layout, so one re-slicing serves every section, and the
// load is exact: no element is recomputed, only moved.
#pragma once
#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_index.h"
#include "checkpoint/shard_reader.h"
#include "core/memory.h"
#include "core/status.h"
#include "model/param_layout.h"

namespace meshtrain::checkpoint {

class TpResliceReader {
 public:
  // `index` (outliving the reader) describes a checkpoint of `config`'s model; `target` is
  // the reader's whole-model layout at its tp rank (every unit, every expert).
  TpResliceReader(const std::string& dir, const CheckpointIndex& index, const model::GptConfig& config,
                  const model::ParamLayout& target);

  // Copies the elements [begin, end) of unit `id` (offsets inside the target's unit) of
  // `section` (0 params, 1 Adam m, 2 Adam v, 3 the previous weight version) into dst.
  Status copy(int section, int id, size_t begin, size_t end, float* dst);

  // Whether units are re-sliced (the writers' tp layout differs from the target's).
  bool reslicing() const { return !direct_; }

 private:
  Status assemble(int section, int id);  // fills cached_ with the target's unit `id`

  const model::ParamLayout& target_;
  bool direct_ = false;
  int saved_tp_ = 1;
  model::ParamLayout global_;                 // tp = 1: each unit whole
  std::deque<model::ParamLayout> saved_;      // per writer tp rank, its whole-model layout
  std::deque<ShardReader> readers_;           // per writer tp rank
  Buffer<float> whole_unit_, saved_unit_, cached_;
  int cached_section_ = -1, cached_id_ = -1;
};

}  // namespace meshtrain::checkpoint
