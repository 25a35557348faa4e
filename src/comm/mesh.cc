#include "comm/mesh.h"

#include <algorithm>
#include <cstdint>

#include "comm/self_group.h"
#include "core/check.h"

namespace meshtrain::comm {

namespace {

// The axis table: each axis's name, its size in a shape, its coordinate, and the axis it
// follows when an order does not name it (-1: it leads). Adding an axis is one row.
struct AxisEntry {
  MeshAxis axis;
  const char* name;
  int MeshShape::*size;
  int MeshCoord::*coord;
  int follows;
  bool required;  // an order must name it
};
constexpr AxisEntry kAxisTable[kMeshAxes] = {
    {MeshAxis::kTp, "tp", &MeshShape::tp, &MeshCoord::tp, -1, true},
    {MeshAxis::kCp, "cp", &MeshShape::cp, &MeshCoord::cp, (int)MeshAxis::kTp, false},
    {MeshAxis::kDp, "dp", &MeshShape::dp, &MeshCoord::dp, (int)MeshAxis::kCp, true},
    {MeshAxis::kPp, "pp", &MeshShape::pp, &MeshCoord::pp, (int)MeshAxis::kDp, true},
};
const AxisEntry& entry(MeshAxis axis) { return kAxisTable[(int)axis]; }

}  // namespace

const char* axis_name(MeshAxis axis) { return entry(axis).name; }
int MeshShape::size(MeshAxis axis) const { return this->*entry(axis).size; }
int& MeshCoord::at(MeshAxis axis) { return this->*entry(axis).coord; }

RankOrder MeshShape::full_order() const {
  RankOrder full = order;
  for (const AxisEntry& e : kAxisTable) {
    if (std::find(full.begin(), full.end(), e.axis) != full.end()) continue;
    auto after = e.follows < 0 ? full.end() : std::find(full.begin(), full.end(), (MeshAxis)e.follows);
    full.insert(after == full.end() ? (e.follows < 0 ? full.begin() : full.end()) : after + 1, e.axis);
  }
  return full;
}

std::string MeshShape::to_string() const {
  return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp) +
         (cp > 1 ? " cp=" + std::to_string(cp) : "") + (ep > 1 ? " ep=" + std::to_string(ep) : "") +
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

Status resolve_mesh(int world, int tp, int pp, int dp, MeshShape* out, int cp) {
  if (world < 1) return Status::error("world size must be >= 1, got " + std::to_string(world));
  if (tp < 1)
    return Status::error("tensor-parallel size (tp) must be >= 1, got " + std::to_string(tp));
  if (pp < 1)
    return Status::error("pipeline-parallel size (pp) must be >= 1, got " + std::to_string(pp));
  if (cp < 1) return Status::error("context-parallel size (cp) must be >= 1, got " + std::to_string(cp));
  if (cp > world)
    return Status::error("--cp " + std::to_string(cp) + " splits each sequence over more ranks than the job's " +
                         std::to_string(world));
  if (dp < 0) {
    return Status::error("data-parallel size (dp) must be >= 1 (or 0 to derive it), got " +
                         std::to_string(dp));
  }
  // The model-parallel axes, as the messages name them (cp only when it is used).
  const int64_t model = int64_t{tp} * cp * pp;
  const std::string names = cp > 1 ? "tp·cp·pp" : "tp·pp";
  const std::string sizes = cp > 1 ? std::to_string(tp) + "·" + std::to_string(cp) + "·" + std::to_string(pp)
                                   : std::to_string(tp) + "·" + std::to_string(pp);
  if (world % model != 0) {
    return Status::error("world size " + std::to_string(world) + " is not divisible by " + names + " = " + sizes +
                         " = " + std::to_string(model));
  }
  const int64_t derived = world / model;
  if (dp != 0 && dp != derived) {
    return Status::error(names + "·dp = " + sizes + "·" + std::to_string(dp) + " = " + std::to_string(model * dp) +
                         " does not equal the world size " + std::to_string(world) +
                         " (leave dp at 0 to derive it)");
  }
  out->tp = tp;
  out->pp = pp;
  out->cp = cp;
  out->dp = static_cast<int>(derived);
  return Status::ok();
}

Status parse_rank_order(const std::string& text, RankOrder* out) {
  auto bad = [&] {
    return Status::error("--rank-order must name tp, dp and pp once each (and cp, if it is to be placed), "
                         "fastest-varying first, joined by '-' (e.g. tp-dp-pp, dp-tp-pp), got '" + text + "'");
  };
  RankOrder order;
  size_t at = 0;
  while (true) {
    const size_t dash = text.find('-', at);
    const std::string name = text.substr(at, dash == std::string::npos ? std::string::npos : dash - at);
    const AxisEntry* found = nullptr;
    for (const AxisEntry& e : kAxisTable)
      if (name == e.name) found = &e;
    if (!found || std::find(order.begin(), order.end(), found->axis) != order.end()) return bad();
    order.push_back(found->axis);
    if (dash == std::string::npos) break;
    at = dash + 1;
  }
  for (const AxisEntry& e : kAxisTable)
    if (e.required && std::find(order.begin(), order.end(), e.axis) == order.end()) return bad();
  *out = order;
  return Status::ok();
}

std::string rank_order_name(const RankOrder& order) {
  std::string name;
  for (MeshAxis axis : order) name += (name.empty() ? "" : "-") + std::string(axis_name(axis));
  return name;
}

MeshCoord Mesh::coordinates(int rank, const MeshShape& shape) {
  CHECK(shape.tp >= 1 && shape.cp >= 1 && shape.pp >= 1 && shape.dp >= 1);
  CHECK(rank >= 0 && rank < shape.world());
  MeshCoord c;
  int stride = 1;
  for (MeshAxis axis : shape.full_order()) {
    c.at(axis) = (rank / stride) % shape.size(axis);
    stride *= shape.size(axis);
  }
  return c;
}

int Mesh::rank_of(const MeshCoord& c, const MeshShape& shape) {
  for (const AxisEntry& e : kAxisTable) CHECK(c.at(e.axis) >= 0 && c.at(e.axis) < shape.size(e.axis));
  int rank = 0, stride = 1;
  for (MeshAxis axis : shape.full_order()) {
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

// The group of the ranks that share every coordinate outside `axes`, ordered by their
// coordinates on `axes` (the first fastest). Every rank calls it in the same sequence.
std::unique_ptr<Group> Mesh::make_group(const std::vector<MeshAxis>& axes, const char* name) {
  int size = 1, color = 0, key = 0, color_stride = 1, key_stride = 1;
  for (MeshAxis a : axes) size *= shape_.size(a), key += coord_.at(a) * key_stride, key_stride *= shape_.size(a);
  for (const AxisEntry& e : kAxisTable)
    if (std::find(axes.begin(), axes.end(), e.axis) == axes.end())
      color += coord_.at(e.axis) * color_stride, color_stride *= shape_.size(e.axis);
  return make_axis(world_, size, color, key, name);
}

Mesh::Mesh(Group& world, const MeshShape& shape) : world_(world), shape_(shape) {
  CHECK_MSG(world.size() == shape.world(), "mesh shape does not match the world size");
  coord_ = coordinates(world.rank(), shape);
  // Same order of splits on every rank: the axis table's.
  for (const AxisEntry& e : kAxisTable) {
    axes_[(int)e.axis] = make_group({e.axis}, e.name);
    CHECK(axes_[(int)e.axis]->size() == shape_.size(e.axis) && axes_[(int)e.axis]->rank() == coord_.at(e.axis));
  }
  if (shape_.cp > 1) grad_ = make_group({MeshAxis::kDp, MeshAxis::kCp}, "dpcp");
  if (const int a = shape_.cp_a2a; a > 1) {
    CHECK_MSG(shape_.cp % a == 0 && a < shape_.cp, "cp_a2a must divide cp and be below it");
    cp_a2a_ = cp().split(coord_.cp / a, coord_.cp % a, "cp");
    cp_ring_ = cp().split(coord_.cp % a, coord_.cp / a, "cp");
  }
  // Inside dp: ep groups of consecutive dp ranks, then the expert-data-parallel groups.
  const MeshShape& s = shape_;
  const MeshCoord& c = coord_;
  CHECK_MSG(s.ep >= 1 && s.dp % s.ep == 0, "ep must divide dp");
  ep_ = make_axis(dp(), s.ep, c.dp / s.ep, c.dp % s.ep, "ep");
  edp_ = make_axis(dp(), s.edp(), c.dp % s.ep, c.dp / s.ep, "edp");
  // The experts' copies under cp: the edp group's ranks at every cp coordinate (their
  // tokens differ), ordered as dp x cp orders the dense gradients' group.
  if (s.cp > 1 && s.ep > 1)
    expert_grad_ = make_axis(grad(), s.edp() * s.cp, c.dp % s.ep, c.dp / s.ep + s.edp() * c.cp, "edpcp");
}

std::map<std::string, AxisStats> Mesh::stats() const {
  std::map<std::string, AxisStats> out = {{world_.axis(), world_.stats()}, {ep_->axis(), ep_->stats()},
                                          {edp_->axis(), edp_->stats()}};
  for (const AxisEntry& e : kAxisTable)
    if (e.axis != MeshAxis::kCp || shape_.cp > 1) out[axes_[(int)e.axis]->axis()] = axes_[(int)e.axis]->stats();
  if (grad_) out[grad_->axis()] = grad_->stats();
  if (expert_grad_) out[expert_grad_->axis()] = expert_grad_->stats();
  for (const Group* g : {cp_a2a_.get(), cp_ring_.get()}) {  // hybrid's: counted as the cp axis's
    if (!g) continue;
    AxisStats& cp = out["cp"];
    const AxisStats s = g->stats();
    cp.bytes += s.bytes, cp.calls += s.calls, cp.wait_s += s.wait_s, cp.busy_s += s.busy_s;
    cp.best_bytes_per_s = std::max(cp.best_bytes_per_s, s.best_bytes_per_s);
  }
  return out;
}

void Mesh::reset_stats() {
  world_.reset_stats();
  for (auto& g : axes_) g->reset_stats();
  ep_->reset_stats();
  edp_->reset_stats();
  if (grad_) grad_->reset_stats();
  if (expert_grad_) expert_grad_->reset_stats();
  for (auto* g : {cp_a2a_.get(), cp_ring_.get()})
    if (g) g->reset_stats();
}

}  // namespace meshtrain::comm
