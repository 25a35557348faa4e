#include "planner/placement.h"

#include <algorithm>
#include <string>

#include "planner/cluster.h"
#include "planner/time_model.h"

namespace meshtrain::planner {

int axis_stride(const Layout& l, comm::MeshAxis axis) {
  const comm::MeshShape shape{.tp = l.tp, .pp = l.pp, .dp = l.dp, .ep = 1, .order = l.order, .cp = l.cp};
  int stride = 1;
  for (comm::MeshAxis a : shape.full_order()) {
    if (a == axis) break;
    stride *= shape.size(a);
  }
  return stride;
}

GroupPlacement place_group(int stride, int size, const Cluster& c) {
  GroupPlacement g;
  const int node = std::max(1, c.gpus_per_node);
  if (size <= 1 || (long long)stride * size <= node) return g;
  g.crosses_hosts = true;
  g.members_per_host = std::clamp(node / std::max(stride, 1), 1, size);
  const double crossing_groups = (double)node / g.members_per_host;  // per host
  const int nics = c.nics_per_node > 0 ? c.nics_per_node : node;
  g.nic_share = nics / crossing_groups;
  return g;
}

Status check_fits_nodes(const Layout& l, const Cluster& c) {
  if (c.nodes <= 0 || (long long)l.world() <= (long long)c.nodes * c.gpus_per_node) return Status::ok();
  return Status::error("the layout needs " + std::to_string(l.world()) + " ranks; cluster " + c.name + " has " +
                       std::to_string(c.nodes) + " nodes x " + std::to_string(c.gpus_per_node) + " = " +
                       std::to_string((long long)c.nodes * c.gpus_per_node));
}

}  // namespace meshtrain::planner
