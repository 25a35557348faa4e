// ZeRO's partition of the flat parameter buffer over the N ranks of a data-parallel group
// (or, unit by unit, of the group that reduces the unit: an MoE expert's unit is shared by
// its expert-data-parallel group only, so it is split over that group's ranks).
// Each unit (embeddings, each block, final norm) is padded to a multiple of N and split
// into N equal shards; rank r owns shard r of every unit. Equal shards make every
// reduce-scatter and all-gather a regular collective, and a unit's shard is an offset
// range, both in the flat buffer and in the rank's local shard buffer (the concatenation
// of its shards, unit by unit).
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "model/param_layout.h"
#include "optim/adamw.h"

namespace meshtrain::parallel {

struct UnitShard {
  size_t global_offset = 0;  // unit start in the flat layout
  size_t numel = 0;          // real elements of the unit
  size_t shard = 0;          // elements per rank: ceil(numel / N)
  size_t local_offset = 0;   // this rank's shard inside the local shard buffer
  size_t padded = 0;         // shard * N
  int world = 1, rank = 0;   // N and this rank's place among them
};

// The group a unit is partitioned over: its size and this rank's rank in it.
struct UnitPartition {
  int world = 1, rank = 0;
};
using PartitionOf = std::function<UnitPartition(const model::ParamUnit&)>;

class ShardLayout {
 public:
  // `align`: every unit's local_offset a multiple of it (file-backed shards: 4 KiB units
  // for O_DIRECT), with unused elements between units; 1: packed.
  // `partition`: a unit's group other than (world, rank) (null: every unit's is).
  ShardLayout(const model::ParamLayout& layout, int world, int rank, size_t align = 1,
              const PartitionOf& partition = nullptr);
  // The data-parallel group's size and this rank's rank in it (unit u's own: world(u), rank(u)).
  int world() const { return world_; }
  int rank() const { return rank_; }
  int world(int u) const { return units_[u].world; }
  int rank(int u) const { return units_[u].rank; }
  const std::vector<UnitShard>& units() const { return units_; }
  size_t local_total() const { return local_total_; }

  // Real (unpadded) global range [begin, end) of unit u owned by `rank`.
  size_t own_begin(int u, int rank) const;
  size_t own_end(int u, int rank) const;
  size_t own_begin(int u) const { return own_begin(u, units_[u].rank); }
  size_t own_end(int u) const { return own_end(u, units_[u].rank); }

  // AdamW segments over this rank's owned elements, split at tensor boundaries (decay
  // differs per tensor). Parameters and gradients are addressed in the full flat buffer
  // (global offsets) or in the local shard buffer, as the ZeRO stage keeps them.
  std::vector<optim::AdamSegment> adam_segments(const model::ParamLayout& layout,
                                                bool params_local, bool grads_local) const;

 private:
  int world_, rank_;
  std::vector<UnitShard> units_;
  size_t local_total_ = 0;
};

}  // namespace meshtrain::parallel
