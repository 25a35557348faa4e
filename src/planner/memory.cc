#include "planner/memory.h"

namespace meshtrain::planner {

namespace {

// Elements of each kind a rank holds: `whole` for a full copy, `shard` for its share.
StateBytes by_stage(double whole, double shard, const StateDtypes& d, int zero) {
  return {d.param * (zero >= 3 ? shard : whole), d.grad * (zero >= 2 ? shard : whole),
          d.optim * (zero >= 1 ? shard : whole)};
}

}  // namespace

StateBytes model_state_bytes(double psi, const StateDtypes& d, int zero, int N) {
  return by_stage(psi, psi / N, d, zero);
}

StateBytes model_state_bytes(const parallel::ShardLayout& shards, size_t total, const StateDtypes& d,
                             int zero) {
  return by_stage((double)total, (double)shards.local_total(), d, zero);
}

}  // namespace meshtrain::planner
