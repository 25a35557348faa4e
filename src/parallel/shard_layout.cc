#include "parallel/shard_layout.h"

#include <algorithm>

namespace meshtrain::parallel {

ShardLayout::ShardLayout(const model::ParamLayout& layout, int world, int rank, size_t align,
                         const PartitionOf& partition)
    : world_(world), rank_(rank) {
  for (const auto& u : layout.units()) {
    UnitShard s;
    const UnitPartition p = partition ? partition(u) : UnitPartition{world, rank};
    s.world = p.world, s.rank = p.rank;
    s.global_offset = u.offset;
    s.numel = u.numel;
    s.shard = (u.numel + p.world - 1) / p.world;
    s.padded = s.shard * p.world;
    s.local_offset = (local_total_ + align - 1) / align * align;
    local_total_ = s.local_offset + s.shard;
    units_.push_back(s);
  }
}

size_t ShardLayout::own_begin(int u, int rank) const {
  const UnitShard& s = units_[u];
  return s.global_offset + std::min(s.numel, (size_t)rank * s.shard);
}

size_t ShardLayout::own_end(int u, int rank) const {
  const UnitShard& s = units_[u];
  return s.global_offset + std::min(s.numel, (size_t)(rank + 1) * s.shard);
}

std::vector<optim::AdamSegment> ShardLayout::adam_segments(const model::ParamLayout& layout,
                                                           bool params_local,
                                                           bool grads_local) const {
  std::vector<optim::AdamSegment> out;
  for (const auto& t : layout.tensors()) {
    const int u = layout.unit_of(t);
    const size_t begin = std::max(t.offset, own_begin(u)), end = std::min(t.offset + t.numel, own_end(u));
    if (begin >= end) continue;
    // Position inside this rank's local shard buffer.
    const size_t local = units_[u].local_offset + (begin - own_begin(u));
    out.push_back({params_local ? local : begin, grads_local ? local : begin, local, end - begin,
                   t.decay, t.tp_copy, layout.unit_of(t)});
  }
  return out;
}

}  // namespace meshtrain::parallel
