// Where a layout's groups sit on the hosts (nodes) of a cluster, from the mesh's rank order
// (comm::MeshShape::order, `--rank-order`): which axes' groups cross hosts, and how many
// groups share each host's network link. Ranks fill hosts in rank order, gpus_per_node at a
// time, as mpirun and srun place them (--map-by slot, the default).
//
// An axis whose ranks are `stride` apart (the product of the axes faster than it in the
// order) forms groups of `size` ranks. A group stays inside one host when stride·size fits
// in a host; otherwise each host holds k = clamp(gpus_per_node / stride, 1, size) of a
// group's members, and a ring over the group leaves each host once, so the host's
// gpus_per_node / k groups cross its links at once: each group gets nics_per_node / (that
// count) of a NIC (the GPU time model's rail-optimised DGX, one NIC per GPU, gives a group
// k NICs; a host with one NIC gives each of its crossing groups a share of it).
#pragma once
#include "comm/mesh.h"
#include "core/status.h"

namespace meshtrain::planner {

struct Cluster;
struct Layout;

// An axis's stride in ranks under the layout's rank order (1 for the fastest).
int axis_stride(const Layout& l, comm::MeshAxis axis);

struct GroupPlacement {
  bool crosses_hosts = false;
  int members_per_host = 1;  // k: a crossing group's members on one host
  double nic_share = 1;      // NICs' worth of inter-host bandwidth each crossing group gets
};

// A group of `size` ranks `stride` apart on cluster `c`.
GroupPlacement place_group(int stride, int size, const Cluster& c);

// An error when the cluster names its node count and the layout needs more ranks than its
// nodes hold.
Status check_fits_nodes(const Layout& l, const Cluster& c);

}  // namespace meshtrain::planner
