// The device mesh: named axes, each with a size and a Group. world = tp × cp × dp × pp ranks
// (cp, context parallelism, is 1 until it lands). An axis is one entry of MeshAxis, one
// size field of MeshShape and one row of the axis table in mesh.cc; the rank order, the
// coordinates and the groups follow from those.
//
// Expert parallelism (MoE) is carved out of dp, as DeepSpeed and Megatron do: with ep | dp,
// the ep group holds ep consecutive dp ranks (dp_rank / ep equal; ep_rank = dp_rank % ep),
// among which an MoE layer's experts are split, and the expert-data-parallel group ("edp",
// dp / ep ranks with the same ep_rank) holds the copies of the same experts, whose
// gradients it sums. Gradients are summed over dp × cp (`grad()`; the dp group itself
// while cp = 1).
//
// Rank order (`order`, fastest first; Megatron-Core's RankGenerator order string): by
// default tp varies fastest, then dp, then pp, so that tp neighbours share a node:
//   rank = tp_rank + tp · (dp_rank + dp · pp_rank)
// Any permutation of the axes is an order ("dp-tp-pp": dp neighbours share a node); an axis
// the order does not name sits right after the axis it follows by default (cp after tp),
// so "tp-dp-pp" is tp-cp-dp-pp. The groups and every result are the same under any order;
// only which ranks they hold changes. The group of an axis holds the ranks that share every
// other coordinate, ordered by their coordinate on the axis.
#pragma once
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "core/status.h"

namespace meshtrain::comm {

// Every axis of the mesh, in the default order (fastest first).
enum class MeshAxis { kTp, kCp, kDp, kPp };
inline constexpr int kMeshAxes = 4;
const char* axis_name(MeshAxis axis);  // "tp", "cp", "dp", "pp"

// The axes an order names, fastest-varying first; unnamed axes are placed by default.
using RankOrder = std::vector<MeshAxis>;
inline const RankOrder kDefaultRankOrder = {MeshAxis::kTp, MeshAxis::kDp, MeshAxis::kPp};

struct MeshShape {
  int tp = 1, pp = 1, dp = 1;
  int ep = 1;  // divides dp
  RankOrder order = kDefaultRankOrder;
  int cp = 1;  // context parallelism: each sequence split over cp ranks
  // --cp-comm hybrid: the cp group's all-to-all groups of cp_a2a consecutive cp ranks, and
  // the ring groups across them (cp_rank % cp_a2a equal); 1: none.
  int cp_a2a = 1;
  int edp() const { return dp / ep; }
  int world() const { return tp * cp * pp * dp; }
  int size(MeshAxis axis) const;
  // Every axis, fastest first: the order's, then the unnamed ones at their default places.
  RankOrder full_order() const;
  std::string to_string() const;  // "tp=2 pp=1 dp=2", with " cp=2", " ep=2" when > 1
};

// "tp-dp-pp", "dp-tp-pp", "tp-cp-dp-pp", ...: distinct axes joined by '-', fastest first;
// tp, dp and pp must be named, cp may be.
Status parse_rank_order(const std::string& text, RankOrder* out);
std::string rank_order_name(const RankOrder& order);

struct MeshCoord {
  int tp = 0, dp = 0, pp = 0, cp = 0;
  int& at(MeshAxis axis);
  int at(MeshAxis axis) const { return const_cast<MeshCoord*>(this)->at(axis); }
};

// Resolves the mesh of `world` ranks from the requested axis sizes; dp = 0 derives dp as
// world / (tp·pp). Errors: a size < 1 (dp < 0), tp·pp not dividing world, tp·pp·dp != world.
// cp (context parallelism) counts like tp and pp: world / (tp·cp·pp) is the derived dp.
Status resolve_mesh(int world, int tp, int pp, int dp, MeshShape* out, int cp = 1);
// Sets out->ep: an error unless ep >= 1 divides out->dp.
Status resolve_expert_parallel(int ep, MeshShape* out);

class Mesh {
 public:
  // Collective over `world` (every rank calls it with the same shape): splits the world
  // into a group per axis (then ep, edp inside dp, and dp × cp when cp > 1). An axis of size 1 is a SelfGroup and needs no MPI
  // communicator. `world` must outlive the Mesh; world.size() must equal shape.world().
  Mesh(Group& world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  Group& world() { return world_; }
  Group& tp() { return *axes_[(int)MeshAxis::kTp]; }
  Group& dp() { return *axes_[(int)MeshAxis::kDp]; }
  Group& pp() { return *axes_[(int)MeshAxis::kPp]; }
  Group& ep() { return *ep_; }
  Group& edp() { return *edp_; }
  Group& cp() { return *axes_[(int)MeshAxis::kCp]; }
  // Inside cp under --cp-comm hybrid (null otherwise): the all-to-all group of this rank's
  // cp_a2a consecutive cp ranks, and the ring of the ranks at its place in the other groups.
  Group* cp_a2a() { return cp_a2a_.get(); }
  Group* cp_ring() { return cp_ring_.get(); }
  Group& axis(MeshAxis a) { return *axes_[(int)a]; }
  // The group gradients are summed over: dp × cp (the dp group itself while cp = 1).
  Group& grad() { return grad_ ? *grad_ : dp(); }
  // The routed experts' gradients: edp × cp (edp itself while cp = 1).
  Group& expert_grad() { return expert_grad_ ? *expert_grad_ : edp(); }
  int ep_rank() const { return coord_.dp % shape_.ep; }
  int tp_rank() const { return coord_.tp; }
  int dp_rank() const { return coord_.dp; }
  int pp_rank() const { return coord_.pp; }
  int cp_rank() const { return coord_.cp; }

  // Pure functions of shape.order (0 <= rank < shape.world()).
  static MeshCoord coordinates(int rank, const MeshShape& shape);
  static int rank_of(const MeshCoord& coord, const MeshShape& shape);

  // Traffic of every group, keyed by axis name: "world", "tp", "dp", "pp", "ep", "edp" (and
  // "cp", "dpcp" when cp > 1; "cp" holds hybrid's all-to-all and ring groups' traffic too).
  std::map<std::string, AxisStats> stats() const;
  void reset_stats();

 private:
  std::unique_ptr<Group> make_group(const std::vector<MeshAxis>& axes, const char* name);

  Group& world_;
  MeshShape shape_;
  MeshCoord coord_;
  std::array<std::unique_ptr<Group>, kMeshAxes> axes_;
  std::unique_ptr<Group> ep_, edp_, grad_, cp_a2a_, cp_ring_, expert_grad_;
};

}  // namespace meshtrain::comm
