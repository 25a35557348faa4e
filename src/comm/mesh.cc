#include "comm/mesh.h"

#include <cstdint>

#include "comm/self_group.h"
#include "core/check.h"

namespace meshtrain::comm {

std::string MeshShape::to_string() const {
  return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp) +
         (ep > 1 ? " ep=" + std::to_string(ep) : "") +
         (order != kDefaultRankOrder ? " order=" + rank_order_name(order) : "");
}

Status resolve_expert_parallel(int ep, MeshShape* out) {
  if (ep < 1) return Status::error("--ep must be >= 1, got " + std::to_string(ep));
  if (out->dp % ep != 0)
    return Status::error("--ep " + std::to_string(ep) + " must divide the data-parallel size dp = " +
                         std::to_string(out->dp) + " (expert parallelism is carved out of dp)");
  out->ep = ep;
  return Status::ok();
}

Status resolve_mesh(int world, int tp, int pp, int dp, MeshShape* out) {
  if (world < 1) return Status::error("world size must be >= 1, got " + std::to_string(world));
  if (tp < 1)
    return Status::error("tensor-parallel size (tp) must be >= 1, got " + std::to_string(tp));
  if (pp < 1)
    return Status::error("pipeline-parallel size (pp) must be >= 1, got " + std::to_string(pp));
  if (dp < 0) {
    return Status::error("data-parallel size (dp) must be >= 1 (or 0 to derive it), got " +
                         std::to_string(dp));
  }
  const int64_t tp_pp = int64_t{tp} * pp;
  if (world % tp_pp != 0) {
    return Status::error("world size " + std::to_string(world) +
                         " is not divisible by tp·pp = " + std::to_string(tp) + "·" +
                         std::to_string(pp) + " = " + std::to_string(tp_pp));
  }
  const int64_t derived = world / tp_pp;
  if (dp != 0 && dp != derived) {
    return Status::error("tp·pp·dp = " + std::to_string(tp) + "·" + std::to_string(pp) + "·" +
                         std::to_string(dp) + " = " + std::to_string(tp_pp * dp) +
                         " does not equal the world size " + std::to_string(world) +
                         " (leave dp at 0 to derive it)");
  }
  out->tp = tp;
  out->pp = pp;
  out->dp = static_cast<int>(derived);
  return Status::ok();
}

namespace {
const char* axis_name(MeshAxis axis) { return axis == MeshAxis::kTp ? "tp" : axis == MeshAxis::kDp ? "dp" : "pp"; }
}  // namespace

Status parse_rank_order(const std::string& text, RankOrder* out) {
  RankOrder order;
  size_t at = 0;
  bool seen[3] = {false, false, false};
  for (int i = 0; i < 3; i++) {
    const size_t dash = text.find('-', at);
    const std::string name = text.substr(at, dash == std::string::npos ? std::string::npos : dash - at);
    const MeshAxis axis = name == "tp" ? MeshAxis::kTp : name == "dp" ? MeshAxis::kDp : MeshAxis::kPp;
    if ((name != "tp" && name != "dp" && name != "pp") || seen[(int)axis] || (i < 2) == (dash == std::string::npos))
      return Status::error("--rank-order must name tp, dp and pp once each, fastest-varying first, joined by '-' "
                           "(e.g. tp-dp-pp, dp-tp-pp), got '" + text + "'");
    seen[(int)axis] = true;
    order[i] = axis;
    at = dash + 1;
  }
  *out = order;
  return Status::ok();
}

std::string rank_order_name(const RankOrder& order) {
  return std::string(axis_name(order[0])) + "-" + axis_name(order[1]) + "-" + axis_name(order[2]);
}

MeshCoord Mesh::coordinates(int rank, const MeshShape& shape) {
  CHECK(shape.tp >= 1 && shape.pp >= 1 && shape.dp >= 1);
  CHECK(rank >= 0 && rank < shape.world());
  MeshCoord c;
  int stride = 1;
  for (MeshAxis axis : shape.order) {
    c.at(axis) = (rank / stride) % shape.size(axis);
    stride *= shape.size(axis);
  }
  return c;
}

int Mesh::rank_of(const MeshCoord& c, const MeshShape& shape) {
  CHECK(c.tp >= 0 && c.tp < shape.tp && c.dp >= 0 && c.dp < shape.dp && c.pp >= 0 &&
        c.pp < shape.pp);
  int rank = 0, stride = 1;
  for (MeshAxis axis : shape.order) {
    rank += c.at(axis) * stride;
    stride *= shape.size(axis);
  }
  return rank;
}

namespace {

// Splits `world` by `color` unless the axis has one rank (then every rank agrees to skip).
std::unique_ptr<Group> make_axis(Group& world, int axis_size, int color, int key,
                                 const char* name) {
  if (axis_size == 1) return std::make_unique<SelfGroup>(name);
  return world.split(color, key, name);
}

}  // namespace

Mesh::Mesh(Group& world, const MeshShape& shape) : world_(world), shape_(shape) {
  CHECK_MSG(world.size() == shape.world(), "mesh shape does not match the world size");
  coord_ = coordinates(world.rank(), shape);
  const MeshShape& s = shape_;
  const MeshCoord& c = coord_;
  // Same order of splits on every rank: tp, dp, pp.
  tp_ = make_axis(world, s.tp, c.dp + s.dp * c.pp, c.tp, "tp");
  dp_ = make_axis(world, s.dp, c.tp + s.tp * c.pp, c.dp, "dp");
  pp_ = make_axis(world, s.pp, c.tp + s.tp * c.dp, c.pp, "pp");
  CHECK(tp_->size() == s.tp && tp_->rank() == c.tp);
  CHECK(dp_->size() == s.dp && dp_->rank() == c.dp);
  CHECK(pp_->size() == s.pp && pp_->rank() == c.pp);
  // Inside dp: ep groups of consecutive dp ranks, then the expert-data-parallel groups.
  CHECK_MSG(s.ep >= 1 && s.dp % s.ep == 0, "ep must divide dp");
  ep_ = make_axis(*dp_, s.ep, c.dp / s.ep, c.dp % s.ep, "ep");
  edp_ = make_axis(*dp_, s.edp(), c.dp % s.ep, c.dp / s.ep, "edp");
}

std::map<std::string, AxisStats> Mesh::stats() const {
  return {{world_.axis(), world_.stats()},
          {tp_->axis(), tp_->stats()},
          {dp_->axis(), dp_->stats()},
          {pp_->axis(), pp_->stats()},
          {ep_->axis(), ep_->stats()},
          {edp_->axis(), edp_->stats()}};
}

void Mesh::reset_stats() {
  world_.reset_stats();
  tp_->reset_stats();
  dp_->reset_stats();
  pp_->reset_stats();
  ep_->reset_stats();
  edp_->reset_stats();
}

}  // namespace meshtrain::comm
