// The device mesh: world = pp × dp × tp ranks, with a Group per axis. Expert parallelism
// (MoE) is carved out of dp, as DeepSpeed and Megatron do: with ep | dp, the ep group holds
// ep consecutive dp ranks (dp_rank / ep equal; ep_rank = dp_rank % ep), among which an
// MoE layer's experts are split, and the expert-data-parallel group ("edp", dp / ep ranks
// with the same ep_rank) holds the copies of the same experts, whose gradients it sums.
//
// Rank order (`order`, fastest first; Megatron's "tp-dp-pp" order string): by default tp
// varies fastest, then dp, then pp, so that tp neighbours share a node:
//   rank = tp_rank + tp · (dp_rank + dp · pp_rank)
// Another order ("dp-tp-pp": dp neighbours share a node) places the same groups on other
// ranks; the groups and every result are the same. The tp group of a rank holds the ranks
// with its (dp, pp) coordinates, ordered by tp_rank; likewise dp (same tp, pp) and pp (same
// tp, dp). Axis names are "tp", "dp", "pp".
#pragma once
#include <array>
#include <map>
#include <memory>
#include <string>

#include "comm/group.h"
#include "core/status.h"

namespace meshtrain::comm {

enum class MeshAxis { kTp, kDp, kPp };
using RankOrder = std::array<MeshAxis, 3>;  // fastest-varying axis first
inline constexpr RankOrder kDefaultRankOrder = {MeshAxis::kTp, MeshAxis::kDp, MeshAxis::kPp};

struct MeshShape {
  int tp = 1, pp = 1, dp = 1;
  int ep = 1;  // divides dp
  RankOrder order = kDefaultRankOrder;
  int edp() const { return dp / ep; }
  int world() const { return tp * pp * dp; }
  int size(MeshAxis axis) const { return axis == MeshAxis::kTp ? tp : axis == MeshAxis::kDp ? dp : pp; }
  std::string to_string() const;  // "tp=2 pp=1 dp=2", with " ep=2" when ep > 1
};

// "tp-dp-pp", "dp-tp-pp", ...: each of tp, dp, pp once, fastest first.
Status parse_rank_order(const std::string& text, RankOrder* out);
std::string rank_order_name(const RankOrder& order);

struct MeshCoord {
  int tp = 0, dp = 0, pp = 0;
  int& at(MeshAxis axis) { return axis == MeshAxis::kTp ? tp : axis == MeshAxis::kDp ? dp : pp; }
  int at(MeshAxis axis) const { return axis == MeshAxis::kTp ? tp : axis == MeshAxis::kDp ? dp : pp; }
};

// Resolves the mesh of `world` ranks from the requested axis sizes; dp = 0 derives dp as
// world / (tp·pp). Errors: a size < 1 (dp < 0), tp·pp not dividing world, tp·pp·dp != world.
Status resolve_mesh(int world, int tp, int pp, int dp, MeshShape* out);
// Sets out->ep: an error unless ep >= 1 divides out->dp.
Status resolve_expert_parallel(int ep, MeshShape* out);

class Mesh {
 public:
  // Collective over `world` (every rank calls it with the same shape): splits the world
  // into the tp, dp and pp groups. An axis of size 1 is a SelfGroup and needs no MPI
  // communicator. `world` must outlive the Mesh; world.size() must equal shape.world().
  Mesh(Group& world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  Group& world() { return world_; }
  Group& tp() { return *tp_; }
  Group& dp() { return *dp_; }
  Group& pp() { return *pp_; }
  Group& ep() { return *ep_; }
  Group& edp() { return *edp_; }
  int ep_rank() const { return coord_.dp % shape_.ep; }
  int tp_rank() const { return coord_.tp; }
  int dp_rank() const { return coord_.dp; }
  int pp_rank() const { return coord_.pp; }

  // Pure functions of shape.order (0 <= rank < shape.world()).
  static MeshCoord coordinates(int rank, const MeshShape& shape);
  static int rank_of(const MeshCoord& coord, const MeshShape& shape);

  // Traffic of every group, keyed by axis name: "world", "tp", "dp", "pp", "ep", "edp".
  std::map<std::string, AxisStats> stats() const;
  void reset_stats();

 private:
  Group& world_;
  MeshShape shape_;
  MeshCoord coord_;
  std::unique_ptr<Group> tp_, dp_, pp_, ep_, edp_;
};

}  // namespace meshtrain::comm
